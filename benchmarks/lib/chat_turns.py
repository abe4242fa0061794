"""benchmarks.sessions' multi-turn workload as OpenAI chat completions: one
trajectory's turns over HTTP, each POSTing the whole conversation so far, and
what each answer says about the prefix cache and re-tokenization.

The seeded plan's token ids become text (the prompt a user message, each
environment output a user message after the assistant's answer); every turn
asks for `return_token_ids` and `logprobs` (what a trainer needs) and samples
its planned length with `ignore_eos`. benchmarks.openai_sessions drives it on
three servers' URLs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from benchmarks.sessions import Plan, Tally, sampling
from rollout_client import pb


@dataclass
class Chat:
    """A Plan as text: the first user message, each turn's length, and the
    environment's message after each turn."""

    prompt: str
    turns: list[int]
    env: list[str]


def chats(plans: Sequence[Plan], decode: Callable[[list[int]], str]) -> list[Chat]:
    return [Chat(decode(p.prompt), p.turns, [decode(e) for e in p.env]) for p in plans]


def drifted(next_prompt: Sequence[int], sampled: Sequence[int], start: int) -> int:
    """How many of a turn's sampled ids, which stood at `start` in its
    context, the next turn's prompt ids hold as other ids at those positions
    (or not at all): the sampled tokens its re-sent history re-tokenized."""
    held = next_prompt[start : start + len(sampled)]
    return sum(a != b for a, b in zip(held, sampled)) + len(sampled) - len(held)


@dataclass
class ChatTally(Tally):
    """Tally's figures, and the sampled tokens the next turn's prompt held
    (`resent`) and re-tokenized into other ids (`retokenized`)."""

    resent: int = 0
    retokenized: int = 0

    def add(self, other: Tally) -> None:
        super().add(other)
        if isinstance(other, ChatTally):
            self.resent += other.resent
            self.retokenized += other.retokenized


def usage(answer: dict[str, Any]) -> pb.Usage:
    """An OpenAI usage object as the Usage benchmarks.sessions tallies."""
    u = answer["usage"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return pb.Usage(
        prompt_tokens=u["prompt_tokens"],
        completion_tokens=u["completion_tokens"],
        cached_prompt_tokens=cached,
    )


async def converse(
    http: aiohttp.ClientSession, url: str, model: str, chat: Chat, tally: ChatTally
) -> None:
    """One trajectory on `url` (a chat completions URL): each turn sends the
    whole conversation, its answer and the environment's message appended."""
    messages = [{"role": "user", "content": chat.prompt}]
    before: pb.Usage | None = None
    last: tuple[list[int], int] | None = None  # the turn before's sampled ids and start
    for n, env in zip(chat.turns, chat.env):
        body = {
            "model": model,
            "messages": messages,
            **sampling(n),
            "return_token_ids": True,
            "logprobs": True,
        }
        async with http.post(url, json=body) as r:
            answer = await r.json(content_type=None)
        if r.status != 200:  # the re-tokenized history outgrew the context
            tally.cut += 1
            return
        prompt, choice = answer["prompt_token_ids"], answer["choices"][0]
        tally.turn(usage(answer), before)
        if last is not None:
            tally.resent += len(last[0])
            tally.retokenized += drifted(prompt, *last)
        before, last = usage(answer), (choice["token_ids"], len(prompt))
        messages += [
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": env},
        ]


def client() -> aiohttp.ClientSession:
    """One connection pool for every trajectory, unbounded (the trajectories
    are the concurrency)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=900)
    )


async def open_session(http: aiohttp.ClientSession, base: str, chat: Chat) -> str:
    """POST /sessions on this service's HTTP front: the session's chat
    completions URL."""
    body = {"messages": [{"role": "user", "content": chat.prompt}]}
    async with http.post(base + "/sessions", json=body) as r:
        opened = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"POST /sessions: {r.status} {opened}")
    return opened["base_url"] + "/chat/completions"

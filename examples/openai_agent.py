"""An agent written only against the `openai` SDK, trained with GRPO on
rollout-service's session URLs.

The agent (`agent`) is the code a user already has: a calculator tool and its
own tool loop (call chat.completions.create with the tools, run the tool,
append its answer, call again). It knows nothing of this service: it takes a
base URL and an API key. The trainer (`Trainer.step`), per step:
- opens one session per episode (gRPC OpenSession) and hands the agent only
  the session's `base_url` and the key: every call the agent makes is a turn
  the server holds token for token (docs/openai.md);
- once every episode has taken a turn, pushes the update computed from the
  step before with PAUSE_MODE_KEEP: the turns in flight go on with the new
  weights, the later turns run on them, and each token keeps its version;
- reads each trajectory with GetSession and takes a GRPO step over its
  sampled tokens only (the prompt, the tool's answers and the template's
  tokens are what the model was shown, not what it did), with the server's
  logprobs as the behaviour policy's.

Printed per step: the prefix-cache share (prompt tokens served from the
cache over every turn's prompt tokens), the mismatch (sampled tokens the
trajectory holds otherwise than the responses reported them: 0, nothing is
re-tokenized), whether each response's prompt ids are its trajectory's
prefix, and how many episodes crossed an update.

The embedded model is random: the agent forces its calls with a named
`tool_choice` (structured output makes them parse), and the server should
give JSON without free whitespace, or a random model pads it to max_tokens:

    rollout-service serve --http-port 8000 --structured-outputs-config \\
        '{"backend": "xgrammar", "disable_any_whitespace": true}' &
    python examples/openai_agent.py --target 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from openai import OpenAI
from openai.types.chat import ChatCompletion
from transformers import AutoModelForCausalLM

from rollout_client import AsyncRolloutClient, pb
from rollout_client.sessions import AsyncSession, loss_mask
from rollout_codecs import dtypes

NUMBER = {"type": "integer", "minimum": 0, "maximum": 999}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Computes a op b.",
            "parameters": {
                "type": "object",
                "properties": {"a": NUMBER, "op": {"enum": ["+", "-", "*"]}, "b": NUMBER},
                "required": ["a", "op", "b"],
                "additionalProperties": False,
            },
        },
    }
]
# An agent's usual long system prompt: whole KV blocks (128 tokens on CPU)
# that every later turn of an episode finds in the prefix cache.
SYSTEM = (
    "You are a careful assistant with one tool, calc, which computes a op b for whole "
    "numbers a and b and an operator op among +, - and *. Call it for every step of the "
    "arithmetic, read its answer in the next message, then reply with the number alone. "
    "Never guess a number: numbers come from the tool. "
)
TASKS = [(17, 23), (48, 7), (305, 12)]


def calc(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def agent(base_url: str, api_key: str, messages: list, turns: int) -> list[ChatCompletion]:
    """The user's agent: tool calls, then an answer. Returns its responses."""
    llm = OpenAI(base_url=base_url, api_key=api_key)
    model = llm.models.list().data[0].id
    responses = []
    for turn in range(turns):
        answer = turn == turns - 1
        r = llm.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            # Forced: a random model would never call the tool by itself.
            tool_choice="none" if answer else {"type": "function", "function": {"name": "calc"}},
            max_tokens=32,
            temperature=1.0,
            extra_body={"return_token_ids": True},  # the ids it sampled, for the trainer's check
        )
        responses.append(r)
        message = r.choices[0].message
        messages.append(message)
        for call in message.tool_calls or []:
            result = calc(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return responses


@dataclass
class Episode:
    """One session's trajectory (GetSession) and what the trainer checks of it."""

    trajectory: pb.GetSessionResponse
    reward: float  # the toy task's: the share of digits in the answer
    cached: int  # prompt tokens of its turns served from the prefix cache
    prompts: int  # prompt tokens of its turns
    mismatch: int  # sampled tokens held otherwise than the responses reported them
    sampled: int  # sampled tokens the responses reported
    prefixes: bool  # each response's prompt ids are the trajectory's prefix
    crossed: bool  # its tokens carry more than one weight version


def episode(t: pb.GetSessionResponse, responses: list[ChatCompletion]) -> Episode:
    reported: dict[int, int] = {}  # position in the trajectory -> sampled id
    prefixes = True
    for r in responses:
        prompt = r.model_extra["prompt_token_ids"]
        prefixes &= list(t.token_ids[: len(prompt)]) == prompt
        sampled = r.choices[0].model_extra["token_ids"]
        reported.update((len(prompt) + k, i) for k, i in enumerate(sampled))
    held = {k: i for k, (i, m) in enumerate(zip(t.token_ids, loss_mask(t))) if m}
    turns = sampled_turns(t)
    answer = responses[-1].choices[0].message.content or ""
    return Episode(
        trajectory=t,
        reward=sum(c.isdigit() for c in answer) / max(1, len(answer)),
        cached=sum(g.cached_prompt_tokens for g in turns),
        prompts=sum(g.start for g in turns),  # a turn's prompt: all before it
        mismatch=sum(held.get(k) != reported.get(k) for k in held.keys() | reported.keys()),
        sampled=len(reported),
        prefixes=prefixes,
        crossed=len({v.weight_version for v in t.version_spans}) > 1,
    )


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=args.lr)
        self.run_id = uuid.uuid4().hex[:6]
        self.api_key = args.token or "unused-without-auth"  # the SDK wants one

    async def push(self, version: str) -> None:
        """The policy in the served dtype; the turns in flight go on (KEEP)."""
        weights = {n: p.detach().to(self.dtype) for n, p in self.policy.named_parameters()}
        await self.client.update_weights(weights, version, pause_mode=pb.PAUSE_MODE_KEEP)

    def grpo(self, batch: list[Episode]) -> None:
        """One clipped policy-gradient step, advantages normalized in the group.
        At temperature 1 the server's logprobs are those of the distribution
        it sampled from, in either logprobs mode."""
        rewards = torch.tensor([e.reward for e in batch])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        self.optimizer.zero_grad()
        for e, advantage in zip(batch, advantages):
            t = e.trajectory
            ids = torch.tensor(list(t.token_ids))
            sampled = torch.tensor(loss_mask(t)[1:], dtype=torch.bool)  # token i + 1 from i
            logits = self.policy(ids[None]).logits[0, :-1].float()
            new = torch.log_softmax(logits, -1).gather(1, ids[1:, None])[:, 0][sampled]
            ratio = torch.exp(new - torch.tensor(list(t.logprobs[1:]))[sampled])
            clipped = ratio.clamp(1 - self.args.clip, 1 + self.args.clip)
            loss = -torch.min(ratio * advantage, clipped * advantage).mean() / len(batch)
            loss.backward()
        self.optimizer.step()

    async def step(self, k: int, update: str | None) -> list[Episode]:
        """One group of episodes on one task; `update` is pushed in their middle."""
        a, (x, y) = self.args, TASKS[k % len(TASKS)]
        task = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{x} * {y}?"}]
        tools = [json.dumps(t) for t in TOOLS]
        sessions: list[AsyncSession] = [
            await self.client.open_session(messages=task, tools_json=tools)
            for _ in range(a.group_size)
        ]
        agents = [
            asyncio.ensure_future(
                asyncio.to_thread(agent, s.opened.base_url, self.api_key, list(task), a.turns)
            )
            for s in sessions
        ]
        if update:  # once every episode has a turn: the rest run on the new weights
            await first_turns(sessions, agents)
            await self.push(update)
        batch = []
        for s, responses in zip(sessions, await asyncio.gather(*agents)):
            batch.append(episode(await s.trajectory(), responses))
            await s.close()
        crossed = sum(e.crossed for e in batch)
        print(
            f"step {k}: reward {sum(e.reward for e in batch) / len(batch):.3f} | cache share "
            f"{sum(e.cached for e in batch) / max(1, sum(e.prompts for e in batch)):.2f} | "
            f"mismatch {sum(e.mismatch for e in batch)} of {sum(e.sampled for e in batch)} "
            f"sampled tokens | prompt ids are the trajectory's prefix: "
            f"{'yes' if all(e.prefixes for e in batch) else 'NO'} | {crossed} of {len(batch)} "
            "episodes crossed an update" + (f" (pushed {update})" if update else ""),
            flush=True,
        )
        self.crossed += crossed
        return batch

    async def run(self) -> None:
        self.client = AsyncRolloutClient(self.args.target, token=self.args.token, timeout=300)
        await self.client.wait_until_ready()
        info = await self.client.server_info()
        self.dtype = getattr(torch, dtypes.torch_name(info.parameters[0].dtype))
        self.crossed, update, t0 = 0, None, time.perf_counter()
        for k in range(self.args.steps):
            batch = await self.step(k, update)
            await asyncio.to_thread(self.grpo, batch)
            update = f"{self.run_id}-{k + 1}"  # pushed in the middle of the next episodes
        await self.push(update or f"{self.run_id}-0")
        episodes = self.args.steps * self.args.group_size
        print(
            f"{self.crossed} of {episodes} episodes crossed an update; "
            f"served {update} | {time.perf_counter() - t0:.1f}s"
        )
        await self.client.close()


async def first_turns(sessions: list[AsyncSession], agents: Sequence[asyncio.Future]) -> None:
    """Until each session holds a sampled turn (or its agent ended). The
    server has no event for it: poll GetSession."""
    for s, a in zip(sessions, agents):
        while not a.done() and not sampled_turns(await s.trajectory()):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def sampled_turns(t: pb.GetSessionResponse) -> list[pb.TrajectorySegment]:
    return [g for g in t.segments if g.source == pb.TOKEN_SOURCE_SAMPLED]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051", help="the server's gRPC address")
    p.add_argument("--token", help="a bearer token with the update role (--tokens-file)")
    p.add_argument("--model", help="the checkpoint the server serves (default: tiny-qwen2)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--group-size", type=int, default=4, help="episodes per step")
    p.add_argument("--turns", type=int, default=3, help="model calls per episode")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=0.2)
    args = p.parse_args()
    if args.model is None:
        from rollout_service.engine.tiny_models import ensure_model

        args.model = str(ensure_model("tiny-qwen2"))
    torch.manual_seed(0)
    asyncio.run(Trainer(args).run())


if __name__ == "__main__":
    main()

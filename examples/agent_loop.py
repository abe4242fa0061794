"""A multi-turn agent RL loop on rollout-service's sessions, in plain PyTorch.

The task: "What is a * b?", with a calculator tool. Each trajectory is a
session the server holds token for token (docs/sessions.md): a model turn, the
tool's answer appended as a chat message, the next turn, ..., a reward on the
last turn. A step, as `Loop.run` runs it:
- Groups: G sessions per task, every turn of every session at once. Only the
  new turn goes over the wire, never the history. GetSession gives back each
  trajectory: its ids, which were SAMPLED, their logprobs and versions, and
  each turn's prompt tokens taken from the prefix cache.
- A GRPO update whose loss counts sampled tokens only (`loss_mask`): the
  prompt, the tool's answers and the template's tokens around them are what
  the model was shown, not what it did.
- Overlap: step k+1's sessions start while the trainer computes step k's
  update, pushed with PAUSE_MODE_KEEP while they run: turns in flight go on
  with the new weights, later turns run on them, and version_spans say which
  version sampled which token of a trajectory that crossed the update.
- The environment takes time: each tool call answers after `--tool-seconds`
  (a sandbox, a search), and the session waits on it holding its history.
- Printed per step: the prefix-cache hit rate of turns after the first that
  no update preceded (a turn after an update reuses none of its history: it
  was computed on the old weights); the training-inference mismatch over
  sampled tokens, each recomputed on the weights of its own version (and, for
  tokens sampled after an update, on the trajectory's first version: what
  ignoring the spans gives); how long the update took to compute; how many
  trajectories crossed an update.

The embedded model is random: the tool reads a call leniently (the first
"a * b" in the turn's text, else the task's own) and the reward is the share
of digits among the last turn's tokens. Against a server on the embedded
model (about 20 s on 2 cores; needs torch and transformers, as the server's
install has):

    rollout-service serve &
    python examples/agent_loop.py --target 127.0.0.1:50051 --report figures.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_client import AsyncRolloutClient, pb
from rollout_client.mismatch import Mismatch, mismatch
from rollout_client.sessions import loss_mask
from rollout_codecs import dtypes

TASKS = [(17, 23), (48, 7), (305, 12)]
# An agent's usual long system prompt: more than a KV block (128 tokens on
# CPU), so even a session's second turn finds whole blocks in the cache.
SYSTEM = (
    "You are a careful assistant with one tool. The tool is calc: write an "
    "arithmetic expression with two whole numbers and one of the operators +, - "
    "or *, such as 17 * 23, and the tool answers with its value in the next "
    "message. Call the tool before you answer, read its answer, then reply with "
    "the number alone. Do not guess: numbers come from the tool."
)
# The mismatch over sampled tokens; then over those sampled after an update,
# on the trajectory's first version (what ignoring version_spans gives) and
# on their own (None: no such token).
Checked = tuple[Mismatch, Mismatch | None, Mismatch | None]
CALL = re.compile(r"(\d+)\s*([-+*])\s*(\d+)")


def calculator(turn_text: str, task: tuple[int, int]) -> str:
    """The tool's answer to a turn: the first expression in it, else the task's."""
    m = CALL.search(turn_text)
    a, op, b = (int(m[1][:9]), m[2], int(m[3][:9])) if m else (task[0], "*", task[1])
    return f"{a} {op} {b} = {a + b if op == '+' else a - b if op == '-' else a * b}"


@dataclass
class Trajectory:
    """One session's trajectory, as GetSession returned it."""

    ids: list[int]
    mask: list[int]  # 1 for sampled tokens: what the loss counts
    sampled: list[int]  # their indices
    logprobs: list[float]  # the service's (behaviour policy), 0 where mask is 0
    versions: list[str]  # per token: the version that sampled it ("" if not sampled)
    turn_tokens: int  # tokens the SessionGenerate calls returned, summed
    one_version_turns: int  # turns after the first with no update since the turn before
    history: int  # their prompt tokens
    cached: int  # how many of them came from the prefix cache
    own_history_cached: int  # such turns that took more than the prompt from the cache
    turns_after_update: int  # turns after the first that started past an update
    stale_history_reused: int  # such turns that took more than the prompt: none may
    reward: float = 0.0
    advantage: float = 0.0


@dataclass
class StepReport:
    step: int
    pushed_version: str  # the version pushed after this step's update
    rollout_versions: list[str]  # versions that sampled this step's tokens
    reward: float
    loss: float
    cache_hit_rate: float  # cached / history over later turns with no update since the last
    one_version_turns: int  # those turns
    own_history_cached: int  # those of them that reused more than the prompt
    turns_after_update: int  # later turns that started past an update
    stale_history_reused: int  # those of them that reused their history: 0
    mismatch_mean: float  # |trainer - service| on each sampled token's own version
    mismatch_max: float
    kl: float
    sampled_tokens: int  # tokens the loss mask marks
    loss_tokens: int  # tokens the update's loss counted
    turn_tokens: int  # tokens the turns returned: equal to both
    total_tokens: int  # every token of the trajectories
    crossed: int  # trajectories whose sampled tokens carry more than one version
    crossed_versions: list[list[str]]  # each crossed trajectory's versions, in order
    stale_mismatch_mean: float | None  # see Checked
    tagged_mismatch_after_update: float | None
    train_seconds: float  # the update's computation, while the next sessions ran
    seconds: float


def read(t: pb.GetSessionResponse, turn_tokens: int) -> Trajectory:
    """A Trajectory from GetSession (its reward is the caller's)."""
    mask = loss_mask(t)
    versions = [""] * len(t.token_ids)
    for span in t.version_spans:
        versions[span.start : span.start + span.count] = [span.weight_version] * span.count
    if [int(bool(v)) for v in versions] != mask:
        raise ValueError("version spans do not cover exactly the sampled tokens")
    prompt = next(g.count for g in t.segments if g.source == pb.TOKEN_SOURCE_PROMPT)
    turns = [g for g in t.segments if g.source == pb.TOKEN_SOURCE_SAMPLED and g.count]
    # A later turn that starts on the version the turn before it ended on can
    # reuse its history; one after an update landed between them cannot (the
    # update reset the cache: that history was computed on the old weights).
    same, after = [], []
    for before, g in zip(turns, turns[1:]):
        ended = versions[before.start + before.count - 1]
        (same if versions[g.start] == ended else after).append(g)
    return Trajectory(
        ids=list(t.token_ids),
        mask=mask,
        sampled=[i for i, m in enumerate(mask) if m],
        logprobs=list(t.logprobs),
        versions=versions,
        turn_tokens=turn_tokens,
        one_version_turns=len(same),
        history=sum(g.start for g in same),  # a turn's prompt: every token before it
        cached=sum(g.cached_prompt_tokens for g in same),
        own_history_cached=sum(g.cached_prompt_tokens > prompt for g in same),
        turns_after_update=len(after),
        stale_history_reused=sum(g.cached_prompt_tokens > prompt for g in after),
    )


class Loop:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        self.digits = {self.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"}
        # The trainer's master copy is fp32; it serves in the server's dtype.
        self.policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=args.lr)
        # A second model to score tokens on the exact weights a version served.
        self.scorer = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        self.served: dict[str, dict[str, torch.Tensor]] = {}  # version -> its weights
        self.run_id = uuid.uuid4().hex[:6]

    async def setup(self) -> None:
        # Created on the running loop: gRPC's asyncio channel belongs to it.
        self.client = AsyncRolloutClient(self.args.target, timeout=300)
        await self.client.wait_until_ready()
        info = await self.client.server_info()
        self.dtype = getattr(torch, dtypes.torch_name(info.parameters[0].dtype))
        # processed_logprobs: the distribution sampled from (after temperature).
        self.processed = info.logprobs_mode == pb.LOGPROBS_MODE_PROCESSED_LOGPROBS
        self.scorer.to(self.dtype)
        await self.push(f"{self.run_id}-0")  # version 0: exactly the trainer's weights

    async def push(self, version: str) -> None:
        """Pushes the policy as the served dtype; the turns in flight go on."""
        # A copy (clone: a float32 `.to` float32 aliases the live parameters).
        weights = {n: p.detach().to(self.dtype).clone() for n, p in self.policy.named_parameters()}
        await self.client.update_weights(weights, version, pause_mode=pb.PAUSE_MODE_KEEP)
        self.served[version] = weights

    async def episode(self, task: tuple[int, int], name: str) -> Trajectory:
        """One session: turns with the tool's answers between them."""
        a = self.args
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {task[0]} * {task[1]}?"},
        ]
        turn_tokens = 0
        async with await self.client.open_session(messages=messages, max_total_tokens=1024) as s:
            for k in range(a.turns):
                turn = await s.generate(
                    request_id=f"{name}-t{k}", max_tokens=a.tokens, temperature=a.temperature
                )
                turn_tokens += len(turn.completion.token_ids)
                if k < a.turns - 1:  # the environment: the tool's answer, as a chat message
                    answer = calculator(turn.completion.text, task)
                    await asyncio.sleep(a.tool_seconds)  # the environment's own time
                    await s.append(messages=[{"role": "tool", "content": answer}])
            x = read(await s.trajectory(), turn_tokens)
        last = turn.completion.token_ids
        x.reward = sum(t in self.digits for t in last) / max(1, len(last))
        return x

    def start(self, step: int) -> asyncio.Future:
        """Every session of a step: `group_size` per task, each with its
        advantage in its group (GRPO)."""

        async def group(i: int) -> list[Trajectory]:
            names = [f"{self.run_id}-s{step}-g{i}-{j}" for j in range(self.args.group_size)]
            g = await asyncio.gather(*(self.episode(TASKS[i], n) for n in names))
            mean = sum(x.reward for x in g) / len(g)
            std = math.sqrt(sum((x.reward - mean) ** 2 for x in g) / len(g))
            for x in g:
                x.advantage = (x.reward - mean) / (std + 1e-4)
            return g

        return asyncio.ensure_future(asyncio.gather(*(group(i) for i in range(len(TASKS)))))

    def logprobs(self, model: torch.nn.Module, x: Trajectory) -> torch.Tensor:
        """`model`'s logprob of each sampled token of x, as the service defines it."""
        ids = torch.tensor([x.ids])
        logits = model(ids).logits[0, :-1].float()  # position i predicts token i + 1
        if self.processed:
            logits = logits / self.args.temperature
        sampled = torch.tensor(x.sampled)
        return torch.log_softmax(logits[sampled - 1], -1).gather(1, ids[0, sampled, None])[:, 0]

    @torch.no_grad()
    def score(self, x: Trajectory, versions: list[str]) -> list[float]:
        """x's sampled tokens' logprobs, token i on weights `versions[i]`. A
        KEEP update recomputes a kept turn's KV on the new weights and resets
        the prefix cache, so each token is a plain forward pass over all that
        precedes it on its own version's weights."""
        per_version = {}
        for v in set(versions):
            self.scorer.load_state_dict(self.served[v], strict=False)
            per_version[v] = self.logprobs(self.scorer, x).tolist()
        return [per_version[v][i] for i, v in enumerate(versions)]

    def check(self, batch: list[Trajectory]) -> Checked:
        """The mismatch of sampled tokens (see Checked)."""
        service, tagged, after_s, after_t, stale = [], [], [], [], []
        for x in batch:
            own = [x.versions[i] for i in x.sampled]
            lps = [x.logprobs[i] for i in x.sampled]
            scored = self.score(x, own)
            service += lps
            tagged += scored
            if len(set(own)) > 1:
                late = [k for k, v in enumerate(own) if v != own[0]]
                old = self.score(x, [own[0]] * len(own))
                after_s += [lps[k] for k in late]
                after_t += [scored[k] for k in late]
                stale += [old[k] for k in late]
        if not after_s:
            return mismatch(service, tagged), None, None
        return mismatch(service, tagged), mismatch(after_s, stale), mismatch(after_s, after_t)

    def train(self, batch: list[Trajectory]) -> tuple[float, int]:
        """One clipped importance-weighted policy-gradient step over sampled
        tokens; the loss and how many tokens it counted."""
        self.optimizer.zero_grad()
        losses, counted = [], 0
        for x in batch:
            new = self.logprobs(self.policy, x)
            ratio = torch.exp(new - torch.tensor([x.logprobs[i] for i in x.sampled]))
            clipped = torch.clamp(ratio, 1 - self.args.clip, 1 + self.args.clip)
            counted += len(ratio)
            losses.append(-torch.min(ratio * x.advantage, clipped * x.advantage).mean())
        loss = torch.stack(losses).mean()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach()), counted

    async def run(self) -> list[StepReport]:
        await self.setup()
        reports = []
        pending: asyncio.Future | None = self.start(0)
        for step in range(self.args.steps):
            t0 = time.perf_counter()
            assert pending is not None
            batch = [x for g in await pending for x in g]
            # The next sessions start now, on the weights served now.
            pending = self.start(step + 1) if step + 1 < self.args.steps else None
            # Off the event loop, so the sessions' turns go on meanwhile.
            t_train = time.perf_counter()
            loss, counted = await asyncio.to_thread(self.train, batch)
            trained = (loss, counted, time.perf_counter() - t_train)
            # Push while the next sessions' turns run: they go on with the new
            # weights (KEEP). The server has no event for it: poll its info.
            while pending is not None and not pending.done():
                if (await self.client.server_info()).engine_requests:
                    break
                await asyncio.sleep(0.01)
            version = f"{self.run_id}-{step + 1}"
            await self.push(version)
            # After the push (it needs only the versions' copies): new weights sooner.
            checked = await asyncio.to_thread(self.check, batch)
            for v in list(self.served)[:-3]:  # keep the versions still sampling
                del self.served[v]
            reports.append(self.report(step, version, batch, checked, trained, t0))
        await self.client.close()
        return reports

    def report(
        self,
        step: int,
        version: str,
        batch: list[Trajectory],
        checked: Checked,
        trained: tuple[float, int, float],
        t0: float,
    ) -> StepReport:
        m, stale, after = checked
        crossed = [sorted(set(filter(None, x.versions)), key=x.versions.index) for x in batch]
        crossed = [v for v in crossed if len(v) > 1]
        history = sum(x.history for x in batch)
        r = StepReport(
            step=step,
            pushed_version=version,
            rollout_versions=sorted({v for x in batch for v in x.versions} - {""}),
            reward=sum(x.reward for x in batch) / len(batch),
            loss=trained[0],
            loss_tokens=trained[1],
            cache_hit_rate=sum(x.cached for x in batch) / max(1, history),
            one_version_turns=sum(x.one_version_turns for x in batch),
            own_history_cached=sum(x.own_history_cached for x in batch),
            turns_after_update=sum(x.turns_after_update for x in batch),
            stale_history_reused=sum(x.stale_history_reused for x in batch),
            mismatch_mean=m.mean_abs,
            mismatch_max=m.max_abs,
            kl=m.kl,
            sampled_tokens=sum(sum(x.mask) for x in batch),
            turn_tokens=sum(x.turn_tokens for x in batch),
            total_tokens=sum(len(x.ids) for x in batch),
            crossed=len(crossed),
            crossed_versions=crossed,
            stale_mismatch_mean=stale.mean_abs if stale else None,
            tagged_mismatch_after_update=after.mean_abs if after else None,
            train_seconds=trained[2],
            seconds=time.perf_counter() - t0,
        )
        print(
            f"step {step}: reward {r.reward:.3f} loss {r.loss:+.4f} | cache hit "
            f"{r.cache_hit_rate:.2f} of later turns' history ({r.own_history_cached} of "
            f"{r.one_version_turns} reused their own turns; {r.stale_history_reused} of "
            f"{r.turns_after_update} after an update did) | loss mask "
            f"{r.sampled_tokens} sampled of {r.total_tokens} tokens | {m} | {r.crossed} of "
            f"{len(batch)} trajectories crossed an update"
            + (f" (old weights would give {stale.mean_abs:.2e})" if stale else "")
            + f" | trained in {r.train_seconds:.1f}s, pushed {version} | {r.seconds:.1f}s",
            flush=True,
        )
        return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--model", help="the checkpoint the server serves (default: tiny-qwen2)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4, help="sessions per task")
    p.add_argument("--turns", type=int, default=3, help="model turns per session")
    p.add_argument("--tokens", type=int, default=48, help="tokens per turn")
    p.add_argument(
        "--tool-seconds",
        type=float,
        default=0.5,
        help="how long the environment takes to answer a tool call (a sandbox, a search)",
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--report", type=Path, help="write every step's figures here as JSON")
    args = p.parse_args()
    if args.model is None:
        from rollout_service.engine.tiny_models import ensure_model

        args.model = str(ensure_model("tiny-qwen2"))
    torch.manual_seed(0)
    reports = asyncio.run(Loop(args).run())
    if args.report:
        args.report.write_text(json.dumps([asdict(r) for r in reports], indent=1))


if __name__ == "__main__":
    main()

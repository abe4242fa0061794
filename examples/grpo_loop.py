"""A GRPO-style RL loop against rollout-service, in plain PyTorch: no framework.

What it shows, in the order a step runs (`Loop.run`):
- Rollouts: one Generate per prompt with `n` samples (a group), token ids in,
  token ids and the sampled tokens' logprobs out.
- One step off-policy: the rollouts of step k+1 start on the weights served
  now, and step k's update is pushed while they run.
- Updates with PAUSE_MODE_KEEP: the push does not wait for those rollouts nor
  abort them; they go on with the new weights (their KV cache recomputed on
  them), and their tokens say which version produced them (`version_spans`).
  Each step prints how many completions crossed the push and what the push
  kept (`requests_kept`), and why when it kept none.
- The behaviour policy of a token is the version that produced it: the
  service's logprob of the token is the behaviour logprob, so importance
  ratios exp(logp_trainer - logp_service) need no second forward pass. The
  loop checks that claim every step: it recomputes each token's logprob on
  the weights of the token's own version and prints the training-inference
  mismatch (rollout_client.mismatch), and what the mismatch would be had the
  tokens after an update been scored on the old weights.
- Stragglers: once all groups but one are back, the last is aborted (Abort)
  and dropped; its partial tokens come back with FINISH_REASON_ABORT.

Run it against a server on the embedded model (docs/rl-loop.md has the
measured times):

    .venv/bin/rollout-service serve &
    .venv/bin/python examples/grpo_loop.py --target 127.0.0.1:50051

Needs torch and transformers (the server's install has both; a trainer host,
from a clone: pip install './client[torch]' transformers). `--report FILE`
writes every step's figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_client import AsyncRolloutClient, pb
from rollout_client.calls.versions import token_versions
from rollout_client.mismatch import mismatch
from rollout_codecs import dtypes

PROMPTS = [
    "The model should learn to",
    "Once upon a time there was",
    "Reinforcement learning from",
    "A rollout is a sequence of",
    "Weights move, caches reset,",
]


@dataclass
class Rollout:
    """One sampled completion of a group, as the service returned it."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # the service's: the behaviour policy's
    versions: list[str]  # per token: the weight version that produced it
    reward: float = 0.0
    advantage: float = 0.0


@dataclass
class StepReport:
    step: int
    pushed_version: str  # the version pushed after this step's update
    rollout_versions: list[str]  # versions that produced this step's tokens
    reward: float
    loss: float
    mismatch_mean: float  # |trainer - service| on each token's own version
    mismatch_max: float
    kl: float
    two_version_completions: int
    # The push that landed while this step's rollouts ran (none at step 0):
    # the running requests it kept, and in words, with why none if none.
    requests_kept: int
    crossing: str
    # Tokens produced after an update, scored on the version before it:
    # what a trainer that ignored version_spans would compute (None: no such token).
    stale_mismatch_mean: float | None
    tagged_mismatch_after_update: float | None  # the same tokens, on their own version
    aborted_groups: int
    caches_reset: list[str]  # by the push after this step
    seconds: float
    extra: dict = field(default_factory=dict)


def reward_of(token_ids: list[int], vocab: int) -> float:
    """The toy task: the share of tokens from the lower eighth of the vocabulary."""
    return sum(t < vocab // 8 for t in token_ids) / max(1, len(token_ids))


class Loop:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
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
        # In processed_logprobs mode the service reports the distribution it
        # sampled from (after temperature); in raw mode the model's own.
        self.processed = info.logprobs_mode == pb.LOGPROBS_MODE_PROCESSED_LOGPROBS
        self.scorer.to(self.dtype)
        eos = self.policy.generation_config.eos_token_id
        self.eos_ids = sorted(
            {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        )
        # Start from the trainer's own weights: version 0 is exactly what it holds.
        await self.push(f"{self.run_id}-0", self.served_copy())

    def served_copy(self) -> dict[str, torch.Tensor]:
        """The policy in the served dtype, to push and to keep for scoring: a
        clone (`.to` float32 of float32 aliases what the optimizer changes)."""
        return {n: p.detach().to(self.dtype).clone() for n, p in self.policy.named_parameters()}

    async def push(
        self, version: str, weights: dict[str, torch.Tensor]
    ) -> pb.UpdateWeightsResponse:
        """Pushes `weights` as `version`; rollouts in flight go on."""
        ack = await self.client.update_weights(weights, version, pause_mode=pb.PAUSE_MODE_KEEP)
        self.served[version] = weights
        # The caches the update reset before the kept rollouts went on.
        self.caches_reset = [pb.CacheKind.Name(c.cache) for c in ack.caches_reset if c.reset]
        return ack

    def start_rollouts(self, step: int) -> asyncio.Task:
        """One Generate per prompt (a group of n); the last prompt's group is
        long, a straggler for `collect` to abort."""
        a = self.args
        ids = [f"{self.run_id}-s{step}-g{i}" for i in range(len(PROMPTS))]

        async def group(i: int) -> tuple[list[int], pb.GenerateResponse]:
            long = i == len(PROMPTS) - 1
            prompt = self.tokenizer.encode(PROMPTS[i])
            return prompt, await self.client.generate(
                request_id=ids[i],
                prompt_token_ids=prompt,
                n=a.group_size,
                max_tokens=a.tokens * (8 if long else 1),
                min_tokens=a.tokens,
                temperature=a.temperature,
            )

        tasks = [asyncio.ensure_future(group(i)) for i in range(len(PROMPTS))]
        return asyncio.ensure_future(self.collect(tasks, ids))

    async def collect(self, tasks: list[asyncio.Task], ids: list[str]) -> tuple[list, int]:
        """Every group but the slowest; the slowest is aborted and dropped."""
        done: list[tuple[list[int], pb.GenerateResponse]] = []
        pending = set(tasks)
        while len(done) < len(tasks) - 1:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done.extend(t.result() for t in finished)
        aborted = 0
        if pending:
            late = [ids[tasks.index(t)] for t in pending]
            aborted = len((await self.client.abort(late)).request_ids)
            await asyncio.gather(*pending)  # they end at once, FINISH_REASON_ABORT
        return done[: len(tasks) - 1], aborted

    def rollouts(self, responses: list[tuple[list[int], pb.GenerateResponse]]) -> list[Rollout]:
        vocab = self.policy.config.vocab_size
        groups = []
        for prompt, r in responses:
            group = [
                Rollout(prompt, list(c.token_ids), list(c.logprobs), token_versions(c))
                for c in r.completions
            ]
            rewards = [reward_of(x.token_ids, vocab) for x in group]
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
            for x, rew in zip(group, rewards):
                x.reward, x.advantage = rew, (rew - mean) / (std + 1e-4)
            groups.extend(group)
        return groups

    def logprobs(self, model, x: Rollout) -> torch.Tensor:
        """`model`'s logprobs of x's tokens at their positions, as the
        service defines them (see `processed`)."""
        ids = torch.tensor([x.prompt_ids + x.token_ids])
        logits = model(ids).logits[0, len(x.prompt_ids) - 1 : -1].float()
        if self.processed:
            # What the sampler drew from: min_tokens forbids end-of-sequence
            # before the `tokens`-th token, then the temperature.
            logits[: self.args.tokens, self.eos_ids] = -math.inf
            logits = logits / self.args.temperature
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(x.token_ids)[:, None])[:, 0]

    @torch.no_grad()
    def score(self, x: Rollout, versions: list[str]) -> list[float]:
        """x's tokens' logprobs when token i came from weights `versions[i]`.
        A KEEP update drops a kept request's KV cache and recomputes it on
        the new weights before its next token, so each token is a plain
        forward pass over prompt and tokens on its own version's weights."""
        per_version = {}
        for v in set(versions):
            self.scorer.load_state_dict(self.served[v], strict=False)
            per_version[v] = self.logprobs(self.scorer, x).tolist()
        return [per_version[v][i] for i, v in enumerate(versions)]

    def check(self, batch: list[Rollout]) -> dict:
        """The training-inference mismatch on each token's own version, and
        on the rollout's first version for the tokens produced after an update."""
        service = [lp for x in batch for lp in x.logprobs]
        tagged = [lp for x in batch for lp in self.score(x, x.versions)]
        # A trainer that ignored version_spans: every token on the first version.
        stale = [lp for x in batch for lp in self.score(x, [x.versions[0]] * len(x.versions))]
        after = [
            k
            for k, (x, i) in enumerate((x, i) for x in batch for i in range(len(x.token_ids)))
            if x.versions[i] != x.versions[0]
        ]
        m = mismatch(service, tagged)
        out = {"mismatch": m, "stale": None, "tagged_after": None}
        if after:
            out["stale"] = mismatch([service[k] for k in after], [stale[k] for k in after])
            out["tagged_after"] = mismatch([service[k] for k in after], [tagged[k] for k in after])
        return out

    def train(self, batch: list[Rollout]) -> float:
        """One clipped importance-weighted policy-gradient step."""
        self.optimizer.zero_grad()
        losses = []
        for x in batch:
            new = self.logprobs(self.policy, x)
            ratio = torch.exp(new - torch.tensor(x.logprobs))
            clipped = torch.clamp(ratio, 1 - self.args.clip, 1 + self.args.clip)
            losses.append(-torch.min(ratio * x.advantage, clipped * x.advantage).mean())
        loss = torch.stack(losses).mean()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    async def run(self) -> list[StepReport]:
        await self.setup()
        reports = []
        pending = self.start_rollouts(0)
        # The push that lands while `pending` runs: none for the first rollouts.
        landed: pb.UpdateWeightsResponse | None = None
        for step in range(self.args.steps):
            t0 = time.perf_counter()
            responses, aborted = await pending
            batch = self.rollouts(responses)
            checked = self.check(batch)
            loss = self.train(batch)
            version, weights = f"{self.run_id}-{step + 1}", self.served_copy()
            # The next rollouts start now, on the weights served now, and the
            # push lands while they run: they go on with the new weights
            # (KEEP), their tokens tagged with both versions. Started before
            # the update's computation they would overlap it, but they take
            # about 0.1 s, less than it: they would be done before the push.
            pending = self.start_rollouts(step + 1)
            # Push once they run (no event for it: polling the info is the way).
            while not pending.done():
                if (await self.client.server_info()).engine_requests:
                    break
                await asyncio.sleep(0.01)
            ack = await self.push(version, weights)
            # Keep the weights of versions still producing tokens.
            for v in list(self.served)[:-3]:
                del self.served[v]
            m, stale, after = checked["mismatch"], checked["stale"], checked["tagged_after"]
            reports.append(
                StepReport(
                    step=step,
                    pushed_version=version,
                    rollout_versions=sorted({v for x in batch for v in x.versions}),
                    reward=sum(x.reward for x in batch) / len(batch),
                    loss=loss,
                    mismatch_mean=m.mean_abs,
                    mismatch_max=m.max_abs,
                    kl=m.kl,
                    two_version_completions=sum(len(set(x.versions)) > 1 for x in batch),
                    requests_kept=landed.requests_kept if landed else 0,
                    crossing=crossing(landed),
                    stale_mismatch_mean=stale.mean_abs if stale else None,
                    tagged_mismatch_after_update=after.mean_abs if after else None,
                    aborted_groups=aborted,
                    caches_reset=self.caches_reset,
                    seconds=time.perf_counter() - t0,
                )
            )
            r = reports[-1]
            print(
                f"step {step}: reward {r.reward:.3f} loss {r.loss:+.4f} | {m} | "
                f"{r.two_version_completions} of {len(batch)} completions on two versions, "
                + r.crossing
                + (f" (old weights would give {stale.mean_abs:.2e})" if stale else "")
                + f" | {aborted} straggler aborted | pushed {version} | {r.seconds:.1f}s",
                flush=True,
            )
            landed = ack
        responses, _ = await pending
        await self.client.close()
        return reports


def crossing(ack: pb.UpdateWeightsResponse | None) -> str:
    """What the push that landed while a step's rollouts ran did to them."""
    if ack is None:
        return "no push landed while they ran"
    said = f"the push of {ack.weight_version} kept {ack.requests_kept} running requests"
    if ack.HasField("keep_held"):  # the server paused later than KEEP promises
        h = ack.keep_held
        return f"{said}: held {h.seconds:.2f}s by its {h.phase} phase ({h.reason})"
    if not ack.requests_kept:
        return f"{said}: they were done before it paused the engine (longer --tokens cross it)"
    return said


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument(
        "--model",
        help="the checkpoint folder the server serves (default: the embedded tiny-qwen2)",
    )
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt (n)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per completion")
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

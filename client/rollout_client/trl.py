"""TRL's GRPOTrainer with its rollouts from the rollout service, through
GRPOTrainer's public `rollout_func=` argument:

    from rollout_client import RolloutClient
    from rollout_client.trl import ServiceRollout

    rollout = ServiceRollout(RolloutClient("127.0.0.1:50051"))
    trainer = GRPOTrainer(model, reward_funcs, args=config, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout)
    trainer.train()
    rollout.sync(trainer)  # the server ends on the final policy

TRL calls `rollout(prompts, trainer)` once per generation batch. Before
generating, the policy is pushed when an optimizer step happened since the
last push (TRL's own rule for vLLM): one UpdateWeights, cast to the served
dtype, under a version unique to this run; the update resets the server's
caches. Every Generate is then pinned to that version
(`required_weight_version`), one per unique prompt with n completions.
With `measure_mismatch` the policy scores the rollout tokens at once, on the
weights just pushed, and the training-inference mismatch (rollout_client.
mismatch) is kept in `history` and logged with the run's metrics.

Needs the `trl` extra (`pip install './client[trl]'` from a clone); nothing here is
imported by `import rollout_client`. docs/trl.md has the details and limits.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import RolloutClient
from rollout_client.mismatch import Mismatch, mismatch
from rollout_codecs import dtypes, extras

# GRPOConfig's sampling fields and the values that leave sampling unchanged
# (sent only when they differ: the server's defaults are neutral).
_NEUTRAL: dict[str, float | None] = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": None,
    "repetition_penalty": 1.0,
}
# The metrics logged with the run (TRL averages them over each logging step).
METRICS = ("rollout/logp_diff/mean", "rollout/logp_diff/max", "rollout/kl")


def _require(module: str) -> ModuleType:
    return extras.require(module, "rollout_client.trl", extra="trl")


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A short digest of a prompt's token ids (how `history` names prompts)."""
    return hashlib.blake2b(",".join(map(str, prompt_ids)).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class GenerateCall:
    """One Generate of a rollout: one unique prompt, its n completions."""

    prompt_key: str  # prompt_key(prompt ids)
    prompt_tokens: int
    # Usage's prompt tokens read from the prefix cache. With n > 1 it is one
    # completion's count, which may have read the blocks a sibling just wrote.
    cached_prompt_tokens: int
    weight_version: str  # the version that produced every token
    completion_tokens: int


@dataclass(frozen=True)
class RolloutStep:
    """One call of TRL's rollout_func."""

    step: int  # trainer.state.global_step when TRL asked
    version: str  # the version every Generate was pinned to
    ack: pb.UpdateWeightsResponse | None  # the push made for it (None: already served)
    calls: tuple[GenerateCall, ...]  # in prompt order; empty on processes other than the first
    mismatch: Mismatch | None  # this process's rows; None when not measured
    push_seconds: float
    generate_seconds: float


class ServiceRollout:
    """GRPOTrainer's `rollout_func` on a rollout service (see the module's
    docstring). `run_id` prefixes every version (a fresh one by default:
    versions must be unique for the server's lifetime); `measure_mismatch`
    scores each batch's tokens with the policy (one forward pass without
    gradients) for `history` and the logged metrics; `generate_kwargs` adds
    or overrides SamplingParams fields (GRPOConfig.generation_kwargs are
    passed too); `update_kwargs` go to `update_weights` (`streams=4`,
    `same_host=True`, ...); `delta` (on by default) pushes each step after
    the first as the cheaper of a delta against the one before and a full
    update, from what the earlier pushes measured (update_weights(delta=True):
    the client then keeps a copy of the pushed weights; `delta=False` does
    not); `max_workers` Generate calls run at once."""

    def __init__(
        self,
        client: RolloutClient,
        *,
        run_id: str | None = None,
        measure_mismatch: bool = True,
        generate_kwargs: Mapping[str, Any] | None = None,
        update_kwargs: Mapping[str, Any] | None = None,
        delta: bool | Literal["always"] = True,
        max_workers: int = 8,
    ) -> None:
        _require("torch")
        _require("accelerate")
        self.client = client
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.measure_mismatch = measure_mismatch
        self.generate_kwargs = dict(generate_kwargs or {})
        self.update_kwargs = dict(update_kwargs or {})
        if delta:
            self.update_kwargs.setdefault("delta", delta)
        self.max_workers = max_workers
        self.version = ""  # the version pushed last ("" before the first push)
        self.acks: list[pb.UpdateWeightsResponse] = []  # every push of this process, in order
        self.history: list[RolloutStep] = []
        self._pushed: tuple[int, int] | None = None  # (id(trainer), global_step) pushed last
        self._info: pb.GetServerInfoResponse | None = None
        self._warned: set[str] = set()

    @property
    def pushed_versions(self) -> list[str]:
        """The versions this process pushed, in order."""
        return [a.weight_version for a in self.acks]

    # -- weights -----------------------------------------------------------

    def _server_info(self) -> pb.GetServerInfoResponse:
        if self._info is None:
            self._info = self.client.server_info()
        return self._info

    def _tensors(self, model: Any) -> Any:
        """The policy's parameters as (name, tensor), cast to the manifest's
        dtypes (the client refuses any other)."""
        torch = _require("torch")
        served = {p.name: p.dtype for p in self._server_info().parameters}
        for name, param in model.named_parameters():
            if name not in served:
                raise KeyError(
                    f"{name} is not a parameter of the served model (a PEFT or "
                    "sharded model needs its weights merged or gathered first)"
                )
            want = getattr(torch, dtypes.torch_name(served[name]))
            t = param.detach()
            yield name, t if t.dtype == want else t.to(want)

    def sync(self, trainer: Any) -> pb.UpdateWeightsResponse | None:
        """Pushes the policy when an optimizer step happened since the last
        push (or the trainer is another one); the update resets the server's
        caches. Called before every rollout; call it after `train()` for the
        server to end on the final weights. The acknowledgement, or None when
        nothing was pushed (or on processes other than the first)."""
        key = (id(trainer), trainer.state.global_step)
        if key == self._pushed:
            return None
        version = f"{self.run_id}-step-{key[1]}"
        if any(a.weight_version == version for a in self.acks):  # a second trainer
            version = f"{version}.{len(self.acks)}"
        ack = None
        accelerator = trainer.accelerator
        if accelerator.is_main_process:
            model = accelerator.unwrap_model(trainer.model)
            ack = self.client.update_weights(self._tensors(model), version, **self.update_kwargs)
            self.acks.append(ack)
        self._pushed, self.version = key, version
        return ack

    # -- rollouts ----------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        t0 = time.perf_counter()
        ack = self.sync(trainer)
        t1 = time.perf_counter()
        args, accelerator = trainer.args, trainer.accelerator
        training = trainer.model.training
        n = args.num_generations if training else args.num_generations_eval or args.num_generations
        # Each prompt arrives n times in a row and a group may straddle two
        # processes, so (like TRL's vLLM server mode) the first process
        # generates for all of them and hands each process its rows.
        multi = accelerator.num_processes > 1
        if multi:
            acc_utils = _require("accelerate.utils")  # not typed: Any
            everything = acc_utils.gather_object(prompts)
        else:
            everything = prompts
        rows: list[Any] = [None, (), ""]
        if accelerator.is_main_process:
            rows = [*self._generate(everything, n, trainer), self.version]
        if multi:
            acc_utils.broadcast_object_list(rows, from_process=0)
            self.version = rows[2]  # the first process's run id names the versions
        out: dict[str, list[Any]] = rows[0]
        if multi:
            mine = slice(
                accelerator.process_index * len(prompts),
                (accelerator.process_index + 1) * len(prompts),
            )
            out = {k: v[mine] for k, v in out.items()}
        t2 = time.perf_counter()
        found = self._mismatch(out, trainer) if self.measure_mismatch else None
        self.history.append(
            RolloutStep(
                step=trainer.state.global_step,
                version=self.version,
                ack=ack,
                calls=tuple(rows[1]) if accelerator.is_main_process else (),
                mismatch=found,
                push_seconds=t1 - t0,
                generate_seconds=t2 - t1,
            )
        )
        return out

    def _sampling(self, args: Any) -> dict[str, Any]:
        """SamplingParams from GRPOConfig: temperature always, the others
        when not neutral, then generation_kwargs and this object's own."""
        sampling: dict[str, Any] = {"temperature": args.temperature}
        for k, neutral in _NEUTRAL.items():
            v = getattr(args, k, neutral)
            if v is not None and v != neutral:
                sampling[k] = v
        if isinstance(args.generation_kwargs, Mapping):
            sampling.update(args.generation_kwargs)
        sampling.update(self.generate_kwargs)
        return sampling

    def _prompt_ids(self, prompt: Any, trainer: Any) -> list[int]:
        """A prompt's token ids, made as TRL makes them."""
        tok = trainer.processing_class
        if isinstance(prompt, list):  # conversational
            ids = tok.apply_chat_template(
                prompt,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **(trainer.args.chat_template_kwargs or {}),
            )
        else:
            ids = tok(text=prompt)["input_ids"]
        return [int(i) for i in ids]

    def _generate(
        self, prompts: list[Any], n: int, trainer: Any
    ) -> tuple[dict[str, list[Any]], list[GenerateCall]]:
        unique = prompts[::n]
        if len(prompts) != n * len(unique) or any(
            prompts[i] != unique[i // n] for i in range(len(prompts))
        ):
            raise ValueError(
                f"TRL's prompts do not come in groups of {n} (num_generations) "
                "repeated in a row: this TRL version hands rollout_func another layout"
            )
        sampling = self._sampling(trainer.args)
        max_tokens = trainer.args.max_completion_length
        version = self.version

        def one(prompt: Any) -> tuple[list[int], pb.GenerateResponse]:
            ids = self._prompt_ids(prompt, trainer)
            r = self.client.generate(
                prompt_token_ids=ids,
                n=n,
                max_tokens=max_tokens,
                required_weight_version=version,
                **sampling,
            )
            return ids, r

        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "weight_version": [],  # passed on to the reward functions
        }
        calls = []
        with ThreadPoolExecutor(max(1, min(self.max_workers, len(unique)))) as pool:
            for ids, r in pool.map(one, unique):
                calls.append(
                    GenerateCall(
                        prompt_key=prompt_key(ids),
                        prompt_tokens=r.usage.prompt_tokens,
                        cached_prompt_tokens=r.usage.cached_prompt_tokens,
                        weight_version=r.weight_version,
                        completion_tokens=r.usage.completion_tokens,
                    )
                )
                for c in sorted(r.completions, key=lambda c: c.index):
                    if not c.token_ids:  # TRL indexes the last token of each
                        raise RuntimeError(
                            "the service returned an empty completion (finish reason "
                            f"{pb.FinishReason.Name(c.finish_reason)}); GRPOTrainer cannot use it"
                        )
                    out["prompt_ids"].append(ids)
                    out["completion_ids"].append(list(c.token_ids))
                    out["logprobs"].append(list(c.logprobs))
                    out["weight_version"].append(r.weight_version)
        return out, calls

    # -- mismatch ----------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def _mismatch(self, out: Mapping[str, list[Any]], trainer: Any) -> Mismatch | None:
        """The policy's logprobs of this process's rollout tokens against the
        service's, logged through TRL's reward-metric channel."""
        mode = self._server_info().logprobs_mode
        temperature = float(trainer.args.temperature)
        if mode == pb.LOGPROBS_MODE_PROCESSED_LOGPROBS:
            tempered = True
        elif mode == pb.LOGPROBS_MODE_RAW_LOGPROBS:
            tempered = False
            if temperature != 1.0:
                self._warn_once(
                    "raw",
                    f"the server reports raw logprobs, TRL scores logits/{temperature}: "
                    "start it with --logprobs-mode processed_logprobs",
                )
        else:
            self._warn_once(
                "mode",
                f"the server reports {pb.LogprobsMode.Name(mode)}, not logprobs: "
                "no mismatch is measured",
            )
            return None
        mine = self.policy_logprobs(
            trainer,
            out["prompt_ids"],
            out["completion_ids"],
            temperature if tempered else 1.0,
        )
        service = [x for row in out["logprobs"] for x in row]
        policy = [x for row in mine for x in row]
        pairs = [(s, p) for s, p in zip(service, policy) if math.isfinite(s) and math.isfinite(p)]
        found = mismatch([s for s, _ in pairs], [p for _, p in pairs])
        log_metric = getattr(trainer, "_log_metric", None)  # what reward functions' log_metric is
        if callable(log_metric):
            for name, value in zip(METRICS, (found.mean_abs, found.max_abs, found.kl)):
                log_metric(name, value)
        return found

    @staticmethod
    def policy_logprobs(
        trainer: Any,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """The trainer's policy's logprob of each completion token after its
        prompt (of logits / temperature), without gradients or dropout, in
        the trainer's autocast, `per_device_train_batch_size` rows at a time;
        laid out like TRL's own recomputation (left-padded prompts, right-
        padded completions) with positions counted from each prompt's start."""
        torch = _require("torch")
        model = trainer.accelerator.unwrap_model(trainer.model)
        device = next(model.parameters()).device
        batch = max(1, int(trainer.args.per_device_train_batch_size))
        was_training = model.training
        model.eval()
        result: list[list[float]] = []
        try:
            with torch.no_grad(), trainer.accelerator.autocast():
                for start in range(0, len(prompt_ids), batch):
                    ps = prompt_ids[start : start + batch]
                    cs = completion_ids[start : start + batch]
                    width_p, width_c = max(map(len, ps)), max(map(len, cs))
                    ids = torch.zeros((len(ps), width_p + width_c), dtype=torch.long)
                    mask = torch.zeros_like(ids)
                    for j, (p, c) in enumerate(zip(ps, cs)):
                        lo, hi = width_p - len(p), width_p + len(c)
                        ids[j, lo:hi] = torch.tensor([*p, *c])
                        mask[j, lo:hi] = 1
                    positions = (mask.cumsum(-1) - 1).clamp(min=0)
                    logits = model(
                        input_ids=ids.to(device),
                        attention_mask=mask.to(device),
                        position_ids=positions.to(device),
                        logits_to_keep=width_c + 1,
                    ).logits[:, :-1]
                    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
                    targets = ids[:, width_p:].to(device)
                    picked = logps.gather(-1, targets[..., None])[..., 0].cpu()
                    result.extend(picked[j, : len(c)].tolist() for j, c in enumerate(cs))
        finally:
            model.train(was_training)
        return result

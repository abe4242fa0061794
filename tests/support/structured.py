"""A sampled completion under a structured-output constraint."""

from __future__ import annotations

from rollout_client import pb


def constrained(stub, seed: int, **so) -> pb.Completion:
    """60 tokens at temperature 1 after "Answer:", constrained by `so` (the
    fields of StructuredOutput)."""
    sampling = pb.SamplingParams(
        max_tokens=60, temperature=1.0, seed=seed, structured_output=pb.StructuredOutput(**so)
    )
    request = pb.GenerateRequest(prompt_text="Answer:", sampling_params=sampling)
    return stub.Generate(request, timeout=120).completions[0]

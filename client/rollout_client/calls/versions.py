"""Which weight version produced each token of a completion."""

from __future__ import annotations

from collections.abc import Sequence

from rollout.v1 import rollout_pb2 as pb


def token_versions(completion: pb.Completion) -> list[str]:
    """One weight version per token of `completion.token_ids`, from its
    version spans: a rollout that lived through a PAUSE_MODE_KEEP update has
    two (or more). ValueError when the spans do not cover the tokens exactly
    (a server older than version spans sends none)."""
    return expand_spans(completion.version_spans, len(completion.token_ids))


def expand_spans(spans: Sequence[pb.VersionSpan], n_tokens: int) -> list[str]:
    """The spans as one version per token, checked to tile 0..n_tokens."""
    out: list[str] = []
    for span in spans:
        if span.start != len(out):
            raise ValueError(f"version span starts at token {span.start}, expected {len(out)}")
        out.extend([span.weight_version] * span.count)
    if len(out) != n_tokens:
        raise ValueError(f"version spans cover {len(out)} of {n_tokens} tokens")
    return out

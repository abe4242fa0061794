"""An update made ready to send and sent: what both clients' update_weights
start from (the source checked against the served manifest, batched,
with its progress bar, deadline and the state it shares with whoever may
interrupt it), the AdapterTarget of a LoRA load or removal, and the retry of
a whole update after UNAVAILABLE. push.py and push_async.py send it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.connection import ConnectionOptions, Metadata, RolloutError
from rollout_client.weights import push, update_options
from rollout_client.weights.interrupts import PushState
from rollout_client.weights.update_options import UpdateOptions
from rollout_codecs import extras


def adapter_target(name: str | None, config: dict[str, Any] | None) -> pb.AdapterTarget | None:
    """The AdapterTarget of a LoRA load (None: a base update)."""
    if name is None:
        if config is not None:
            raise TypeError("adapter_config needs adapter (the adapter's name)")
        return None
    if config is None:
        raise TypeError("adapter needs adapter_config (PEFT's adapter_config.json as a dict)")
    return pb.AdapterTarget(
        name=name, action=pb.ADAPTER_ACTION_LOAD, config_json=json.dumps(config)
    )


def adapter_removal(name: str, version: str) -> list[pb.UpdateWeightsRequest]:
    """The UpdateWeights stream that unloads LoRA adapter `name`."""
    target = pb.AdapterTarget(name=name, action=pb.ADAPTER_ACTION_REMOVE)
    begin = pb.UpdateWeightsBegin(weight_version=version, adapter=target)
    return [
        pb.UpdateWeightsRequest(begin=begin),
        pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit()),
    ]


def prepare_update(
    source: Any,
    version: str,
    info: pb.GetServerInfoResponse | None,
    options: UpdateOptions,
    *,
    adapter: pb.AdapterTarget | None,
    timeout: float | None,
    metadata: Metadata,
    state: PushState,
) -> push.Update:
    """The update of `source` with update_weights' `options`, checked
    against the manifest of the server's `info` (None: an adapter's, which
    the server checks) and batched when it takes batches, with its progress
    bar (none for a delta push), deadline, metadata and the state it shares
    with whoever may interrupt it (interrupts.py). Both clients' update
    starts here."""
    manifest = None if info is None else info.parameters
    begin = update_options.begin(options)
    u = push.prepare(source, version, manifest, adapter=adapter, **begin)
    u.batch_chunks = info is not None and info.accepts_chunk_batches
    progress = options.get("progress", False) and not options.get("delta")
    u.progress = _progress_bar(sum(t.nbytes for t in u.tensors), progress)
    u.timeout = timeout
    u.metadata = metadata
    u.state = state
    return u


def _progress_bar(total: int, enabled: bool) -> push.Progress | None:
    if not enabled:
        return None
    tqdm = extras.require("tqdm", "progress=True").tqdm
    bar: push.Progress = tqdm(total=total, unit="B", unit_scale=True, desc="UpdateWeights")
    return bar


def send_update(
    u: push.Update, options: ConnectionOptions, send: Callable[[], pb.UpdateWeightsResponse]
) -> pb.UpdateWeightsResponse:
    """`send()`, again after UNAVAILABLE as often as `options` says, with the
    same backoff as the unary calls' policy.

    gRPC's retry policy cannot do this for a client stream (it would have to
    hold the whole stream to replay it), and a retry of one call of a staged
    update would find the update half done. A whole update is safe to send
    again: a retry begins afresh with the same version and bytes; one the
    server has applied already is answered with the original acknowledgement
    (`replayed`) without touching the engine, one it has not is received anew."""
    delays = iter(options.delays())
    try:
        while True:
            u.state.check()  # stopped while waiting to retry: no new attempt
            try:
                return send()
            except grpc.RpcError as e:
                time.sleep(retry_delay(e, delays))
    finally:
        if u.progress is not None:
            u.progress.close()


def retry_delay(e: grpc.RpcError, delays: Iterator[float]) -> float:
    """How long to wait before sending a whole update again after `e`
    (UNAVAILABLE, while retries are left); raises `e` as a RolloutError
    otherwise. Both clients' retry loops ask this."""
    delay = next(delays, None)
    if e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
        raise RolloutError.wrap(e) from None
    return delay

"""Which role may call which RPC: declared once, as each RPC's
`(rollout.v1.role)` option in the proto; read from the descriptors by the
server (auth.ROLE_OF) and checked against docs/api.md's table; and the real
server refusing and permitting every RPC to every role as declared. Abort is
scoped to the caller's own calls."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from google.protobuf.descriptor_pb2 import MethodOptions

from rollout.v1 import options_pb2, rollout_pb2_grpc
from rollout.v1 import rollout_pb2 as pb
from rollout_service.ops.auth import (
    Refusal,
    Tokens,
    caller_for,
    check_bearer,
    required_role,
    roles_of,
)
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

API_DOC = Path(__file__).parents[3] / "docs/api.md"
SERVICE = pb.DESCRIPTOR.services_by_name["RolloutService"]
TOKENS = {GENERATE: "generate", GENERATE_B: "generate", ADMIN: "admin"}
DENIED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


def declared(method) -> str:
    """The role the proto declares on `method`: "generate" or "admin"."""
    role = method.GetOptions().Extensions[options_pb2.role]
    return options_pb2.Role.Name(role).removeprefix("ROLE_").lower()


def test_every_rpc_declares_its_role_in_the_proto():
    assert [m.name for m in SERVICE.methods if declared(m) not in ("generate", "admin")] == []


def test_the_server_needs_the_role_the_proto_declares():
    for method in SERVICE.methods:
        assert required_role(f"/rollout.v1.RolloutService/{method.name}") == declared(method)
    # An RPC that declares none is the admin's alone.
    bare = SimpleNamespace(name="Unmarked", GetOptions=MethodOptions)
    assert roles_of(SimpleNamespace(methods=[bare])) == {"Unmarked": "admin"}


def test_both_fronts_check_a_bearer_header_alike():
    """auth.check_bearer, the one check of the gRPC interceptor and the HTTP
    front: no bearer token, an unknown one, a role short of admin, or the
    caller (each front words the refusal itself)."""
    tokens = Tokens({"g": "generate", "a": "admin"})
    for header in ("", "g", "Basic g", "Bearer", "Bearer  "):
        assert check_bearer(tokens, header, "generate") == Refusal("missing"), header
    assert check_bearer(tokens, "Bearer x", "generate") == Refusal("unknown")
    assert check_bearer(tokens, "Bearer g", "admin") == Refusal("role", "generate")
    assert check_bearer(tokens, "bearer  g ", "generate") == caller_for("g", "generate")
    assert check_bearer(tokens, "Bearer a", "generate") == caller_for("a", "admin")
    assert check_bearer(tokens, "Bearer a", "admin").admin


def test_the_docs_table_gives_each_rpc_its_declared_role():
    text = API_DOC.read_text()
    table = text[text.index("## RPCs") : text.index("## Errors")]
    documented = {}
    for row in re.findall(r"^\| (`.*?) \| (\w+)[^|]* \|", table, re.M):
        for name in re.findall(r"`(\w+)`", row[0]):
            documented[name] = row[1]
    assert documented == {m.name: declared(m) for m in SERVICE.methods}


@pytest.fixture(scope="module")
def secured(shared_secure):
    certs = shared_secure.certs
    creds = grpc.ssl_channel_credentials(
        certs["ca"].read_bytes(), certs["client_key"].read_bytes(), certs["client"].read_bytes()
    )
    with grpc.secure_channel(shared_secure.proc.target, creds) as channel:
        yield rollout_pb2_grpc.RolloutServiceStub(channel)


def _call(stub, method, token: str | None):
    """Calls `method` with an empty request (an empty stream for client
    streams); the status code it ends with (OK included)."""
    md = [("authorization", f"Bearer {token}")] if token else []
    fn = getattr(stub, method.name)
    request = getattr(pb, method.input_type.name)()
    arg = iter(()) if method.client_streaming else request
    try:
        result = fn(arg, metadata=md, timeout=60)
        if method.server_streaming:
            list(result)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


@pytest.mark.parametrize("token", [None, "wrong", *TOKENS])
def test_every_rpc_answers_each_role_as_the_proto_declares(secured, token):
    for method in SERVICE.methods:
        code = _call(secured, method, token)
        if token not in TOKENS:
            assert code == grpc.StatusCode.UNAUTHENTICATED, method.name
        elif TOKENS[token] == "admin" or declared(method) == "generate":
            assert code not in DENIED, (method.name, code)
        else:
            assert code == grpc.StatusCode.PERMISSION_DENIED, method.name


def _md(token: str):
    return [("authorization", f"Bearer {token}")]


def _long_generate(stub, token: str, request_id: str, out: dict) -> threading.Thread:
    """Starts a 1500-token Generate in a thread; its response lands in out."""
    request = pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=[5, 6, 7],
        sampling_params=pb.SamplingParams(max_tokens=1500, ignore_eos=True, temperature=0),
    )
    thread = threading.Thread(
        target=lambda: out.update({request_id: stub.Generate(request, metadata=_md(token))})
    )
    thread.start()
    return thread


def _abort(stub, token: str, **kw) -> list[str]:
    return list(stub.Abort(pb.AbortRequest(**kw), metadata=_md(token), timeout=30).request_ids)


def _wait_engine_requests(stub, n: int) -> None:
    deadline = time.monotonic() + 60
    while stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=_md(ADMIN)).engine_requests < n:
        assert time.monotonic() < deadline, f"{n} engine requests never ran"
        time.sleep(0.02)


def test_a_generate_caller_aborts_only_its_own_calls(secured):
    out: dict = {}
    threads = [_long_generate(secured, ADMIN, "victim-1", out)]
    _wait_engine_requests(secured, 1)
    # Another caller's call, by id or by `all`: not found, not ended.
    assert _abort(secured, GENERATE, request_ids=["victim-1"]) == []
    assert _abort(secured, GENERATE, all=True) == []
    threads.append(_long_generate(secured, GENERATE_B, "theirs-1", out))
    _wait_engine_requests(secured, 2)
    threads.append(_long_generate(secured, GENERATE, "mine-1", out))
    _wait_engine_requests(secured, 3)
    assert _abort(secured, GENERATE, all=True) == ["mine-1"]
    # The admin may end anyone's.
    assert _abort(secured, ADMIN, request_ids=["theirs-1", "nobody"]) == ["theirs-1"]
    for t in threads:
        t.join(120)
    reasons = {rid: r.completions[0].finish_reason for rid, r in out.items()}
    assert reasons == {
        "mine-1": pb.FINISH_REASON_ABORT,
        "theirs-1": pb.FINISH_REASON_ABORT,
        "victim-1": pb.FINISH_REASON_LENGTH,
    }
    assert len(out["victim-1"].completions[0].token_ids) == 1500

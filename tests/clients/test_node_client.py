"""The TypeScript client (client/node) as an npm package.

`npm pack` in client/node builds the package (the proto copied in, the types
generated from it, tsc) and packs it; the tarball is installed into an empty
folder, and everything below runs from there, never from client/node:

- the packed demo (info, generate, a weight push, generate, reset) against a
  real server started with a tokens file and mutual TLS, checked through the
  Python client; refused without the token, with a token of the wrong role,
  without the client certificate, and without TLS;
- the packed client's retries (UNAVAILABLE retried with backoff: unary calls
  by gRPC's retry policy, UpdateWeights resent whole, GenerateStream and other
  codes not at all), its bearer token on every attempt, and plain TLS with a
  root CA, against a small in-process fake of the service.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from harness.serverproc import ServerProcess
from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutClient
from tests.support.node import NODE_DIR, PACKAGE, REPO, Packed, run
from tests.support.tokens import ADMIN, GENERATE

PROTO_DIR = REPO / "proto" / "rollout"


@pytest.fixture(scope="module")
def certs(shared_secure) -> dict[str, Path]:
    return shared_secure.certs


@pytest.fixture(scope="module")
def secure_server(shared_secure):
    """The session's server with bearer tokens and mutual TLS, and the
    Python client's TLS arguments for it."""
    return shared_secure.proc, shared_secure.tls


def test_the_tarball_holds_the_built_client_and_its_proto(packed):
    files = set(packed.files)
    assert {
        "package.json",
        "dist/client.js",
        "dist/client.d.ts",
        "dist/demo.js",
        "proto/rollout/v1/rollout.proto",
    } <= files
    assert not [f for f in files if f.startswith(("src/", "node_modules/", "scripts/"))], files

    # The bundled proto is the repository's, copied at build time.
    for proto in PROTO_DIR.rglob("*.proto"):
        rel = proto.relative_to(PROTO_DIR.parent)
        assert f"proto/{rel.as_posix()}" in files, rel
        assert (packed.root / "proto" / rel).read_bytes() == proto.read_bytes(), rel
    # The types were generated from it: one per top-level message of every
    # file rollout.proto re-exports (the package is split by concern).
    messages = [
        m
        for proto in (PROTO_DIR / "v1").glob("*.proto")
        for m in re.findall(r"^message (\w+)", proto.read_text(), re.M)
    ]
    assert "GenerateRequest" in messages and "OpenSessionRequest" in messages
    assert messages
    for m in messages:
        assert f"dist/gen/rollout/v1/{m}.d.ts" in files, m

    meta = json.loads((packed.root / "package.json").read_text())
    assert meta["name"] == PACKAGE and "private" not in meta
    assert (packed.root / meta["main"]).is_file() and (packed.root / meta["types"]).is_file()

    # The installed client loads the proto from its own files.
    p = run(["node", "-p", f"require({PACKAGE!r}).DEFAULT_PROTO_PATH"], packed.app, 60)
    assert Path(p.stdout.strip()) == packed.root / "proto" / "rollout" / "v1" / "rollout.proto"

    # A TypeScript consumer type-checks against the package's declarations.
    (packed.app / "consumer.ts").write_text(
        f"""import {{ RolloutClient, RolloutError, type ClientOptions,
  type GenerateResponse__Output, type UpdateWeightsResponse__Output }} from {PACKAGE!r};

const opts: ClientOptions = {{ token: "t", retries: 2, backoffMs: 100,
  rootCertificates: Buffer.from("") }};
const client = new RolloutClient("127.0.0.1:1", opts);
export async function use(): Promise<[string, boolean, number]> {{
  const r: GenerateResponse__Output = await client.generate({{
    prompt_text: "x", sampling_params: {{ max_tokens: 2, temperature: 0 }} }});
  const ack: UpdateWeightsResponse__Output = await client.updateWeights("v", [
    {{ name: "w", dtype: "D_TYPE_BFLOAT16", shape: [1], data: new Uint8Array(2) }}]);
  return [r.weight_version, ack.replayed, new RolloutError(14, "x").code];
}}
"""
    )
    (packed.app / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022",
                    "lib": ["ES2022"],
                    "module": "node16",
                    "moduleResolution": "node16",
                    "strict": True,
                    "noEmit": True,
                    "typeRoots": [str(NODE_DIR / "node_modules" / "@types")],
                    "types": ["node"],
                },
                "files": ["consumer.ts"],
            }
        )
    )
    tsc = NODE_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    run(["node", str(tsc), "-p", "tsconfig.json"], packed.app, 300)


def _demo_args(server: ServerProcess, certs, *, ca=True, client_cert=True) -> list[str]:
    args = ["--target", server.target]
    if ca:
        args += ["--tls-ca", str(certs["ca"])]
    if client_cert:
        args += ["--tls-cert", str(certs["client"]), "--tls-key", str(certs["client_key"])]
    return args


def test_packed_demo_with_a_token_and_mutual_tls(packed, secure_server, certs):
    server, tls = secure_server
    version = f"node-{uuid.uuid4().hex[:12]}"
    # The token from ROLLOUT_TOKEN, the TLS files from the documented flags.
    p = packed.demo_run(*_demo_args(server, certs), "--version", version, token=ADMIN)
    assert p.returncode == 0, f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert lines, f"the demo printed nothing\n--- stderr\n{p.stderr}"
    result = json.loads(lines[-1])
    assert result["ok"] is True
    assert result["version"] == version
    assert 0 < len(result["tokens_before"]) <= 8
    assert 0 < len(result["tokens_after"]) <= 8
    assert "[reset] CACHE_KIND_PREFIX reset=true" in p.stdout

    # The Python client sees what the Node client pushed.
    with RolloutClient(server.target, token=ADMIN, **tls) as client:
        assert client.server_info().weight_version == version
        r = client.generate(prompt_text="Hello from Node", max_tokens=8, temperature=0)
    assert r.weight_version == version
    # Same prompt, same greedy settings, same weights: the same tokens.
    assert list(r.completions[0].token_ids) == result["tokens_after"]

    # --token wins over ROLLOUT_TOKEN; a generate-role token may generate but not push.
    p = packed.demo_run(
        *_demo_args(server, certs), "--token", GENERATE, "--retries", "0", token=ADMIN
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "[before] token_ids=" in p.stdout
    assert "PERMISSION_DENIED" in p.stderr and "admin" in p.stderr
    assert "(reason ROLE_DENIED)" in p.stderr, "the ErrorInfo reason reaches RolloutError"
    with RolloutClient(server.target, token=ADMIN, **tls) as client:
        assert client.server_info().weight_version == version


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no token", "UNAUTHENTICATED"),
        ("no client certificate", "UNAVAILABLE"),
        ("no TLS", "UNAVAILABLE"),
    ],
)
def test_packed_demo_is_refused_without_credentials(packed, secure_server, certs, case, expected):
    server, _ = secure_server
    args = _demo_args(server, certs, ca=case != "no TLS", client_cert=case == "no token")
    p = packed.demo_run(
        *args, "--wait-ms", "3000", "--timeout-ms", "10000", "--retries", "0",
        token=None if case == "no token" else ADMIN,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    assert "demo failed" in p.stderr and expected in p.stderr, p.stderr


# --- retries, the token and plain TLS against a fake of the service --------


class FakeRollout(rollout_pb2_grpc.RolloutServiceServicer):
    """Fails the first `fail_first` attempts of every call with UNAVAILABLE
    and records each attempt: its time, its authorization header and, for
    UpdateWeights, what the stream carried. GenerateStream always fails with
    UNAVAILABLE; Generate of the prompt "bad" fails with INVALID_ARGUMENT."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.attempts: dict[str, list[dict]] = {}

    def _attempt(self, name: str, context, fail: bool = True, **seen) -> int:
        metadata = dict(context.invocation_metadata())
        auth, tenant = metadata.get("authorization"), metadata.get("rollout-tenant")
        with self.lock:
            calls = self.attempts.setdefault(name, [])
            calls.append(
                {"time": time.monotonic(), "authorization": auth, "tenant": tenant, **seen}
            )
            n = len(calls)
        if fail and n <= self.fail_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{name}: attempt {n} fails")
        return n

    def GetServerInfo(self, request, context):
        self._attempt("GetServerInfo", context)
        return pb.GetServerInfoResponse(model="fake", weight_version="v0")

    def Generate(self, request, context):
        if request.prompt_text == "bad":
            self._attempt("Generate(bad)", context, fail=False)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt_text: bad")
        self._attempt("Generate", context)
        return pb.GenerateResponse(weight_version="v0")

    def ResetCaches(self, request, context):
        self._attempt("ResetCaches", context)
        return pb.ResetCachesResponse(results=[pb.CacheResetResult(reset=True)])

    def GenerateStream(self, request, context):
        self._attempt("GenerateStream", context)
        context.abort(grpc.StatusCode.UNAVAILABLE, "GenerateStream always fails")

    def UpdateWeights(self, request_iterator, context):
        version, data, committed = "", bytearray(), False
        for msg in request_iterator:
            kind = msg.WhichOneof("kind")
            if kind == "begin":
                version = msg.begin.weight_version
            elif kind == "chunk":
                data[msg.chunk.offset : msg.chunk.offset] = msg.chunk.data
            elif kind == "commit":
                committed = True
        n = self._attempt(
            "UpdateWeights", context, version=version, data=bytes(data), committed=committed
        )
        return pb.UpdateWeightsResponse(
            weight_version=version, bytes_received=len(data), replayed=n > 1
        )


PROBE = f"""
const fs = require("node:fs");
const {{ RolloutClient }} = require({PACKAGE!r});
const cfg = JSON.parse(process.argv[2]);
const client = new RolloutClient(cfg.target, {{
  retries: cfg.retries, backoffMs: cfg.backoffMs, token: cfg.token, tenant: cfg.tenant,
  timeoutMs: 20000,
  rootCertificates: cfg.ca ? fs.readFileSync(cfg.ca) : undefined,
}});
const outcome = async (f) => {{
  try {{ return {{ ok: await f() }}; }}
  catch (e) {{ return {{ error: e.codeName ?? String(e), details: e.details }}; }}
}};
(async () => {{
  const out = {{}};
  out.info = await outcome(() => client.serverInfo());
  out.generate = await outcome(() => client.generate({{ prompt_text: "hi" }}));
  out.bad = await outcome(() => client.generate({{ prompt_text: "bad" }}));
  out.reset = await outcome(() => client.resetCaches());
  out.update = await outcome(() => client.updateWeights("v1",
    [{{ name: "w", dtype: "D_TYPE_BFLOAT16", shape: [2, 3], data: Buffer.from("abcdefghijkl") }}],
    {{ chunkBytes: 5 }}));
  out.stream = await outcome(async () => {{
    let n = 0;
    for await (const _ of client.generateStream({{ prompt_text: "hi" }})) n++;
    return n;
  }});
  client.close();
  console.log(JSON.stringify(out));
}})();
"""


def _fake_server(fail_first: int, certs=None):
    fake = FakeRollout(fail_first)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(fake, server)
    if certs is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:  # TLS without client certificates
        creds = grpc.ssl_server_credentials(
            [(certs["server_key"].read_bytes(), certs["server"].read_bytes())]
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return fake, server, f"127.0.0.1:{port}"


def _probe(packed: Packed, **cfg) -> dict:
    script = packed.app / "probe.js"
    script.write_text(PROBE)
    p = run(["node", str(script), json.dumps(cfg)], packed.app, 120)
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tls", [False, True], ids=["insecure", "tls"])
def test_packed_client_retries_unavailable_and_sends_the_token(packed, certs, tls):
    backoff_ms = 200
    fake, server, target = _fake_server(fail_first=2, certs=certs if tls else None)
    try:
        ca = str(certs["ca"]) if tls else None
        out = _probe(
            packed, target=target, retries=3, backoffMs=backoff_ms, token="tok", tenant="t", ca=ca
        )
    finally:
        server.stop(0)

    # Unary calls: two UNAVAILABLE attempts, then the answer.
    assert out["info"]["ok"]["model"] == "fake", out
    assert out["generate"]["ok"]["weight_version"] == "v0"
    assert out["reset"]["ok"]["results"][0]["reset"] is True
    for name in ("GetServerInfo", "Generate", "ResetCaches"):
        assert len(fake.attempts[name]) == 3, (name, out)
    # Exponential backoff between attempts (gRPC's +-20% jitter; load only adds).
    times = [a["time"] for a in fake.attempts["GetServerInfo"]]
    for i, gap in enumerate(b - a for a, b in zip(times, times[1:])):
        assert gap >= 0.75 * backoff_ms * 2**i / 1000, (i, gap)

    # UpdateWeights: the whole stream again, each attempt complete.
    assert out["update"]["ok"]["weight_version"] == "v1"
    assert out["update"]["ok"]["replayed"] is True
    updates = fake.attempts["UpdateWeights"]
    assert len(updates) == 3
    assert all(u["version"] == "v1" and u["committed"] for u in updates)
    assert all(u["data"] == b"abcdefghijkl" for u in updates)

    # Not retried: other codes, and GenerateStream.
    assert out["bad"]["error"] == "INVALID_ARGUMENT"
    assert len(fake.attempts["Generate(bad)"]) == 1
    assert out["stream"]["error"] == "UNAVAILABLE"
    assert len(fake.attempts["GenerateStream"]) == 1

    # The bearer token on every attempt of every call.
    auth = {a["authorization"] for calls in fake.attempts.values() for a in calls}
    assert auth == {"Bearer tok"}
    # ... and the tenant (the server's fair share, docs/operations.md).
    assert {a["tenant"] for calls in fake.attempts.values() for a in calls} == {"t"}


def test_packed_client_without_retries_or_without_the_ca(packed, certs):
    fake, server, target = _fake_server(fail_first=1)
    try:
        out = _probe(packed, target=target, retries=0, backoffMs=100)
    finally:
        server.stop(0)
    for key, name in (("info", "GetServerInfo"), ("update", "UpdateWeights")):
        assert out[key]["error"] == "UNAVAILABLE", out
        assert len(fake.attempts[name]) == 1
    assert {a["authorization"] for calls in fake.attempts.values() for a in calls} == {None}
    assert {a["tenant"] for calls in fake.attempts.values() for a in calls} == {None}

    # A TLS server whose CA the client was not given: the handshake fails.
    fake, server, target = _fake_server(fail_first=0, certs=certs)
    try:
        out = _probe(packed, target=target, retries=0, backoffMs=100)
    finally:
        server.stop(0)
    assert out["info"]["error"] == "UNAVAILABLE", out
    assert "GetServerInfo" not in fake.attempts

"""The Node client's delta pushes and chunk batches (client/node/src/delta.ts,
pushed.ts, push.ts), run from the packed tarball (conftest's `packed`):

- its SPARSE_XOR8 bytes are rollout_codecs.delta's, byte for byte, on the
  edge cases the C++ client is checked on and on a simulated RL step, from
  aligned and unaligned buffers alike; its decoder gives the new bytes back
  and names what is wrong with a hostile payload; it numbers and sizes every
  DType as the Python client does;
- its chunk messages are the Python client's (rollout_client/weights/push.py
  `groups`), checked on the wire of a fake server that takes batches;
- against the session's secure server: a full push, then two deltas (each
  acknowledged with only the encoded bytes received, the server's delta base
  moving with them) serve what a Python full push of the same bytes serves;
  a push after another trainer's goes full, and so does one whose delta the
  server refuses (DELTA_BASE_MISMATCH), with the way and why of each push in
  the client's history.
"""

from __future__ import annotations

import json
import threading
import uuid
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import torch

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutClient
from rollout_client.weights import push
from rollout_codecs import delta, dtypes
from tests.support import delta_steps
from tests.support.delta_cases import XOR8_CASES, xor8_case, xor8_entries
from tests.support.greedy import assert_same, served
from tests.support.node import PACKAGE, SECURE_CLIENT_JS, Packed, run, secure_cfg, start_script
from tests.support.tokens import ADMIN

# ------------------------------------------------------------- the codec

CODEC = f"""
const fs = require("node:fs");
const {{ encodeSparseXor8, applySparseXor8, chunkMessages, tensorSpec }} = require({PACKAGE!r});
const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const unaligned = (b) => {{
  const u = new Uint8Array(b.byteLength + 1);
  u.set(b, 1);
  return u.subarray(1);
}};
const refusal = (f) => {{ try {{ f(); return null; }} catch (e) {{ return e.message; }} }};
const out = {{ cases: [], groups: [], refusals: [] }};
for (const c of cfg.cases) {{
  const base = new Uint8Array(fs.readFileSync(c.base));
  const next = new Uint8Array(fs.readFileSync(c.next));
  const payload = encodeSparseXor8(base, next);
  fs.writeFileSync(c.out, payload);
  const again = encodeSparseXor8(unaligned(base), unaligned(next));
  const target = Uint8Array.from(base);
  applySparseXor8(target, payload);
  out.cases.push({{ unalignedSame: Buffer.compare(Buffer.from(again), Buffer.from(payload)) === 0,
    decoded: Buffer.compare(Buffer.from(target), Buffer.from(next)) === 0 }});
}}
for (const g of cfg.groups) out.groups.push([...chunkMessages(g.sizes, g.chunkBytes, true)]);
const tensor = new Uint8Array(10);
for (const p of cfg.hostile) {{
  out.refusals.push(refusal(() => applySparseXor8(tensor, Uint8Array.from(p))));
}}
// Each DType by its number, with the bytes Python's table says it takes.
const specDtype = (n, size) => {{
  try {{
    return tensorSpec({{ name: "t", dtype: n, shape: [3], data: new Uint8Array(3 * size) }}).dtype;
  }} catch (e) {{ return e.message; }}
}};
out.dtypes = cfg.dtypes.map(([n, size]) => specDtype(n, size));
console.log(JSON.stringify(out));
"""

# Tensor sizes whose chunks group differently: small ones batched, one at a
# quarter of the chunk size alone, empty tensors, more than 1024 small ones.
GROUPS = [
    {"sizes": [10, 300_000, 5, 0, 7, 262_143, 262_144, 1_048_577], "chunkBytes": 1 << 20},
    {"sizes": [12] * 2500, "chunkBytes": 1 << 20},
    {"sizes": [900, 1000, 1100, 40, 3000], "chunkBytes": 1000},
]


def _python_groups(sizes: list[int], chunk_bytes: int) -> list[list[list[int]]]:
    u = push.Update(
        tensors=[SimpleNamespace(nbytes=n) for n in sizes],  # type: ignore[misc]
        begin=pb.UpdateWeightsBegin(),
        chunk_bytes=chunk_bytes,
        batch_chunks=True,
    )
    return [[list(p) for p in group] for group in push.groups(u, push.pieces(u))]


def _step_bytes(step: dict[str, torch.Tensor]) -> bytes:
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in step.values())


def test_node_sparse_xor8_is_pythons_byte_for_byte(packed: Packed, tmp_path: Path):
    cases = [(f"case-{i}", *xor8_case(p.values[0], p.values[1])) for i, p in enumerate(XOR8_CASES)]
    # A simulated RL step of the embedded model, every tensor end to end.
    start = delta_steps.initial()
    (step,) = delta_steps.simulate(start, steps=1)
    cases.append(("rl-step", *(np.frombuffer(_step_bytes(s), np.uint8) for s in (start, step))))
    cfg: dict = {"cases": [], "groups": GROUPS}
    cfg["dtypes"] = [[int(n), info.itemsize] for n, info in dtypes.TABLE.items()]
    for name, base, new in cases:
        (tmp_path / f"{name}.base").write_bytes(base.tobytes())
        (tmp_path / f"{name}.next").write_bytes(new.tobytes())
        files = {k: str(tmp_path / f"{name}.{k}") for k in ("base", "next", "out")}
        cfg["cases"].append(files)
    # Hostile payloads against a 10-byte tensor: short, a count that lies,
    # a gap of 0, a byte past the end.
    cfg["hostile"] = [[1, 0], [2, 0, 0, 0, 1, 1], [1, 0, 0, 0, 7, 0], [1, 0, 0, 0, 7, 11]]
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    script = packed.app / "codec.js"
    script.write_text(CODEC)
    out = json.loads(run(["node", str(script), str(tmp_path / "cfg.json")], packed.app, 120).stdout)

    for (name, base, new), got in zip(cases, out["cases"], strict=True):
        payload = (tmp_path / f"{name}.out").read_bytes()
        want = delta.encode_sparse(base, new).tobytes()
        assert payload == want, name
        assert got == {"unalignedSame": True, "decoded": True}, name
    for p, (name, *_) in zip(XOR8_CASES, cases):
        k = int.from_bytes((tmp_path / f"{name}.out").read_bytes()[:4], "little")
        assert k == xor8_entries(p.values[1]), p.id
    rl = (tmp_path / "rl-step.out").read_bytes()
    assert 4 < len(rl) < len(cases[-1][1])  # a real step changes some bytes, not all

    for g, got in zip(GROUPS, out["groups"], strict=True):
        assert got == _python_groups(g["sizes"], g["chunkBytes"])
    assert [len(m) for m in out["groups"][1]] == [1024, 1024, 452]

    # Every DType the proto has, numbered and sized as the Python client's one table.
    assert set(dtypes.TABLE) == set(pb.DType.values()) - {pb.D_TYPE_UNSPECIFIED}
    assert out["dtypes"] == [pb.DType.Name(n) for n in dtypes.TABLE]

    short, lying, zero_gap, past = out["refusals"]
    assert "shorter than the 4-byte entry count" in short
    assert "entry count 2 makes it 8" in lying
    assert "gap 0 is 0" in zero_gap
    assert "names byte 10, but the tensor has 10" in past


# ------------------------------------------------ chunk batches on the wire


class BatchesServer(rollout_pb2_grpc.RolloutServiceServicer):
    """Says it takes chunk batches, and records each UpdateWeights message's
    chunks as (tensor index, offset, length)."""

    def __init__(self) -> None:
        self.messages: list[list[list[int]]] = []
        self.lock = threading.Lock()

    def GetServerInfo(self, request, context):
        return pb.GetServerInfoResponse(model="fake", accepts_chunk_batches=True)

    def UpdateWeights(self, request_iterator, context):
        version = ""
        for msg in request_iterator:
            kind = msg.WhichOneof("kind")
            if kind == "begin":
                version = msg.begin.weight_version
            elif kind in ("chunk", "chunks"):
                chunks = [msg.chunk] if kind == "chunk" else list(msg.chunks.chunks)
                with self.lock:
                    self.messages.append([[c.tensor_index, c.offset, len(c.data)] for c in chunks])
        return pb.UpdateWeightsResponse(weight_version=version)


BATCHES = f"""
const {{ RolloutClient }} = require({PACKAGE!r});
const cfg = JSON.parse(process.argv[2]);
const client = new RolloutClient(cfg.target, {{ retries: 0, timeoutMs: 20000 }});
(async () => {{
  const tensors = cfg.sizes.map((n, i) => ({{
    name: `t${{i}}`, dtype: "D_TYPE_FLOAT8_E4M3FN", shape: [n], data: new Uint8Array(n) }}));
  await client.updateWeights("v1", tensors, {{ chunkBytes: cfg.chunkBytes }});  // not asked yet
  await client.serverInfo();
  const progress = [];
  await client.updateWeights("v2", tensors, {{ chunkBytes: cfg.chunkBytes,
    onProgress: (sent, total) => progress.push([sent, total]) }});
  client.close();
  console.log(JSON.stringify({{ progress }}));
}})();
"""


def test_node_client_batches_chunks_as_the_python_client_does(packed: Packed):
    fake = BatchesServer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    g = GROUPS[0]
    try:
        script = packed.app / "batches.js"
        script.write_text(BATCHES)
        cfg = {"target": f"127.0.0.1:{port}", **g}
        out = json.loads(run(["node", str(script), json.dumps(cfg)], packed.app, 120).stdout)
    finally:
        server.stop(0)
    singles = [[list(p)] for p in push.pieces(_python_update(g["sizes"], g["chunkBytes"]))]
    batched = _python_groups(g["sizes"], g["chunkBytes"])
    assert any(len(m) > 1 for m in batched)
    # Before the client has seen the server take batches: one chunk a message.
    assert fake.messages == singles + batched
    # Progress still counts every chunk.
    total = sum(g["sizes"])
    assert [p[1] for p in out["progress"]] == [total] * len(singles)
    assert out["progress"][-1][0] == total


def _python_update(sizes: list[int], chunk_bytes: int) -> push.Update:
    return push.Update(
        tensors=[SimpleNamespace(nbytes=n) for n in sizes],  # type: ignore[misc]
        begin=pb.UpdateWeightsBegin(),
        chunk_bytes=chunk_bytes,
    )


# ----------------------------------------------------- against the server

# Reads commands from stdin, one JSON line each, and answers each with one:
# {push: version, file, staleBase?}: updateWeights(delta: true) of the
# tensors in `file` (with staleBase, serverInfo answers as if the server's
# delta base were still this client's last push: another trainer pushed
# between the client's look and its delta).
PUSHER = f"""
const {{ RolloutClient }} = require({PACKAGE!r});
{SECURE_CLIENT_JS}
const serverInfo = client.serverInfo.bind(client);
const tensorsOf = (file) => {{
  const bytes = new Uint8Array(fs.readFileSync(file));
  return cfg.tensors.map((t) => ({{ name: t.name, dtype: "D_TYPE_BFLOAT16", shape: t.shape,
    data: bytes.subarray(t.offset, t.offset + t.nbytes) }}));
}};
const lines = readline.createInterface({{ input: process.stdin }});
lines.on("line", async (line) => {{
  const cmd = JSON.parse(line);
  if (cmd.quit) {{ client.close(); lines.close(); return; }}
  client.serverInfo = cmd.staleBase
    ? async (o) => ({{ ...(await serverInfo(o)), delta_base_version: client.pushed.version }})
    : serverInfo;
  try {{
    const opts = {{ delta: true, chunkBytes: 65536 }};
    const ack = await client.updateWeights(cmd.push, tensorsOf(cmd.file), opts);
    const h = client.pushed.history;
    console.log(JSON.stringify({{ ack, record: h[h.length - 1], held: client.pushed.nbytes }}));
  }} catch (e) {{
    console.log(JSON.stringify({{ error: e.codeName ?? String(e), details: e.details }}));
  }}
}});
"""


class Pusher:
    """The Node client in a process of its own, pushing on command."""

    def __init__(self, packed: Packed, cfg: dict) -> None:
        self.node = start_script(packed, "pusher.js", PUSHER, cfg)

    def push(self, version: str, file: Path, stale_base: bool = False) -> dict:
        assert self.node.stdin is not None and self.node.stdout is not None
        self.node.stdin.write(
            json.dumps({"push": version, "file": str(file), "staleBase": stale_base}) + "\n"
        )
        self.node.stdin.flush()
        line = self.node.stdout.readline()  # '' if node died: every call has a deadline
        assert line, f"node printed nothing\n--- stderr\n{self.node.stderr.read()[-4000:]}"
        out = json.loads(line)
        assert "error" not in out, out
        return out

    def close(self) -> None:
        try:
            self.node.communicate(json.dumps({"quit": True}) + "\n", timeout=60)
        finally:
            if self.node.poll() is None:
                self.node.kill()
                self.node.wait()


def test_node_delta_push_serves_what_a_python_full_push_serves(packed, shared_secure, tmp_path):
    start = delta_steps.initial()
    steps = delta_steps.simulate(start, steps=6)
    layout, offset = [], 0
    for name, t in start.items():
        layout.append({"name": name, "shape": list(t.shape), "offset": offset, "nbytes": t.nbytes})
        offset += t.nbytes
    model_bytes = offset
    files = []
    for i, s in enumerate(steps):
        files.append(tmp_path / f"step{i}.bin")
        files[-1].write_bytes(_step_bytes(s))
    cfg = secure_cfg(shared_secure, ADMIN, tensors=layout)
    options = {"token": ADMIN, "timeout": 120, "retries": 0, **shared_secure.tls}
    node = Pusher(packed, cfg)
    try:
        with RolloutClient(shared_secure.proc.target, **options) as admin:
            v = f"node-delta-{uuid.uuid4().hex[:12]}"

            def python_push(i: int, version: str) -> list:
                admin.update_weights(steps[i], version)
                return served(admin)

            a = node.push(f"{v}-a", files[0])
            assert a["record"]["way"] == "full"
            assert a["record"]["why"] == "no push of this client acknowledged yet"
            assert a["ack"]["bytes_received"] == model_bytes
            served_a = served(admin)

            for i, name in ((1, "b"), (2, "c")):
                d = node.push(f"{v}-{name}", files[i])
                r, ack = d["record"], d["ack"]
                assert r["way"] == "delta", r
                assert ack["previous_weight_version"] == (f"{v}-a" if i == 1 else f"{v}-b")
                # Only the encoded bytes travelled: a tenth of the values changed.
                assert ack["bytes_received"] == r["wireBytes"] < model_bytes / 2
                assert r["encodedTensors"] > 0 and r["modelBytes"] == model_bytes
                assert admin.server_info().delta_base_version == f"{v}-{name}"
            assert d["held"] == model_bytes  # the client's copy of what it pushed
            served_c = served(admin)
            assert served_c != served_a  # the steps change what is served
            assert_same(served_c, python_push(2, f"{v}-c-python"))

            # Another trainer pushed (the Python push above): the next goes full.
            d = node.push(f"{v}-d", files[3])
            assert d["record"]["way"] == "full", d
            assert f'"{v}-c-python"' in d["record"]["why"]
            assert d["ack"]["bytes_received"] == model_bytes

            # Another pushes between the client's look and its delta: the
            # server refuses the delta's base, and the same bytes go full.
            python_push(4, f"{v}-e-python")
            f = node.push(f"{v}-f", files[5], stale_base=True)
            assert f["record"]["way"] == "full"
            assert "DELTA_BASE_MISMATCH" in f["record"]["why"]
            assert f["ack"]["previous_weight_version"] == f"{v}-e-python"
            assert f["ack"]["bytes_received"] == model_bytes
            served_f = served(admin)
            assert_same(served_f, python_push(5, f"{v}-f-python"))
    finally:
        node.close()

"""The C++ trainer client (client/cpp) end to end: builds it with CMake
(stubs generated from the proto at build time by protoc + grpc_cpp_plugin),
runs it against a real server over mutual TLS with a bearer token, and checks
what it did through the Python client.

The server is the test's own (TLS and tokens on), so the weights the program
pushes do not reach the session server that other tests share.

Its delta mode (--base-seed) is checked twice: without a server, its
SPARSE_XOR16 bytes (--encode-only) against rollout_codecs.delta's encoder, and
against the server, where a delta must give the outputs a full push of the
same bytes gives, and a refused base must end in a full push.

Its `session` subcommand (client/cpp/session_step.cc) drives one multi-turn
session; what it prints is checked against the ids it sent and sampled, and
against the trajectory the Python client reads from the server."""

from __future__ import annotations

import json
import math
import os
import subprocess
import uuid
from pathlib import Path

import crc32c
import grpc
import numpy as np
import pytest
import torch

from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.sessions import Session, loss_mask
from rollout_codecs import delta, dtypes
from tests.support import cpp_build
from tests.support.delta_cases import XOR8_CASES, xor8_case, xor8_entries
from tests.support.served_weights import served_checkpoint
from tests.support.tokens import ADMIN, GENERATE

# Its tests wait for the build started at collection (tests/support/cpp_build.py,
# at the lowest CPU priority): they run after the others, engine-free ones
# included, so that the build has had the whole run's idle CPU, not a wait of
# its own (55 s of setup in the engine-free tests when they ran in file order).
pytestmark = pytest.mark.late

SEED = 20240611
PROMPT_LEN = 200  # more than one KV block, so that a repeat hits the prefix cache
MAX_TOKENS = 16


def _run(cmd, timeout, env=None, check=True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check:
        assert p.returncode == 0, (
            f"`{' '.join(map(str, cmd))}` exited {p.returncode}\n"
            f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
        )
    return p


@pytest.fixture(scope="module")
def trainer() -> Path:
    """client/cpp built into build/cpp-tests at -Og (tests/support/cpp_build.py:
    started at collection; incremental on re-runs)."""
    if missing := cpp_build.missing_tools():
        pytest.fail(
            f"{', '.join(missing)} not found: the C++ client test needs Debian's g++, make, "
            "cmake, protobuf-compiler, protobuf-compiler-grpc, libprotobuf-dev and "
            "libgrpc++-dev (run scripts/setup-native, or scripts/setup --dev)",
            pytrace=False,
        )
    return cpp_build.built()


@pytest.fixture(scope="module")
def secure(shared_secure):
    """The session's server with tokens and mutual TLS, and the arguments
    that reach it: (server, Python TLS kwargs, C++ TLS flags)."""
    certs = shared_secure.certs
    flags = ["--tls-ca", certs["ca"], "--tls-cert", certs["client"]]
    flags += ["--tls-key", certs["client_key"]]
    return shared_secure.proc, shared_secure.tls, flags


@pytest.fixture(scope="module")
def admin(secure):
    proc, tls, _ = secure
    with RolloutClient(proc.target, token=ADMIN, timeout=120, **tls) as c:
        yield c


@pytest.fixture
def base_offered(admin):
    """The secure server offering a delta base, as a fresh one does: an
    earlier module's update that wrote bytes and did not apply leaves slots
    stale until a full update sends them (the suite's check between modules,
    a staged update opened and aborted before any byte, leaves them as they
    were), so one is pushed first when needed."""
    if not admin.server_info().delta_base_version:
        admin.update_weights(served_checkpoint(admin), f"cpp-base-{uuid.uuid4().hex[:12]}")
    assert admin.server_info().delta_base_version


def _run_trainer(
    trainer, secure, *args, subcommand=(), token: str | None = ADMIN, tls=True, check=True
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Runs the program; returns (the process, its JSON summary)."""
    proc, _, flags = secure
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TOKEN"}
    if token is not None:
        env["ROLLOUT_TOKEN"] = token  # the environment route; --token is the other
    p = _run(
        [trainer, *subcommand, "--target", proc.target, *(flags if tls else []), *args],
        timeout=600,
        env=env,
        check=check,
    )
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert lines, f"the program printed nothing\n--- stderr\n{p.stderr}"
    return p, json.loads(lines[-1])


def _trainer(trainer, secure, *args, **kwargs):
    """Runs the program; returns (exit status, its JSON summary)."""
    p, out = _run_trainer(trainer, secure, *args, **kwargs)
    return p.returncode, out


# The program's new tensor values, recomputed here from its documented rule
# (client/cpp/rollout_trainer.cc, NewValues and ChangedValues): a second
# implementation.
_M = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _fnv1a64(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & _M
    return h


def _splitmix64(state: int, n: int) -> np.ndarray:
    """Outputs 0..n-1 of splitmix64 from `state`: mix(state + (i + 1) * golden)."""
    u = np.uint64
    z = u(state & _M) + np.arange(1, n + 1, dtype=u) * u(_GOLDEN)  # wraps modulo 2^64
    z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
    return z ^ (z >> u(31))


def _values(name: str, n: int, seed: int) -> np.ndarray:
    norm = name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name
    k = (_splitmix64(seed * _GOLDEN + _fnv1a64(name), n) % np.uint64(97)).astype(np.int64) - 48
    return 1 + k / 64 if norm else k / 1024


def _picked(name: str, n: int, seed: int, percent: float) -> np.ndarray:
    """Delta mode's rule: which elements take seed's value."""
    h = _splitmix64((seed + (1 << 32)) * _GOLDEN + _fnv1a64(name), n)
    return h % np.uint64(1_000_000) < np.uint64(round(percent * 10_000))


def _changed_values(name: str, n: int, base_seed: int, seed: int, percent: float) -> np.ndarray:
    pick = _picked(name, n, seed, percent)
    return np.where(pick, _values(name, n, seed), _values(name, n, base_seed))


def _as_tensor(values: np.ndarray, dtype: pb.DType, shape) -> torch.Tensor:
    t = torch.from_numpy(values).to(getattr(torch, dtypes.torch_name(dtype)))
    return t.reshape(list(shape))


def _new_tensor(spec: pb.TensorSpec, seed: int) -> torch.Tensor:
    return _as_tensor(_values(spec.name, math.prod(spec.shape), seed), spec.dtype, spec.shape)


def _delta_tensor(spec: pb.TensorSpec, base_seed: int, seed: int, percent: float) -> torch.Tensor:
    values = _changed_values(spec.name, math.prod(spec.shape), base_seed, seed, percent)
    return _as_tensor(values, spec.dtype, spec.shape)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _checkpoint_tensor(name: str) -> torch.Tensor:
    from safetensors import safe_open

    from rollout_service.engine.tiny_models import ensure_model

    for f in sorted(ensure_model("tiny-qwen2").glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            if name in st.keys():
                return st.get_tensor(name)
    raise KeyError(name)


def _greedy(client: RolloutClient, prompt: list[int]) -> pb.GenerateResponse:
    return client.generate(
        prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True
    )


def _tokens_logprobs(r: pb.GenerateResponse) -> tuple[list[int], list[float]]:
    c = r.completions[0]
    return list(c.token_ids), list(c.logprobs)


CACHES = ["CACHE_KIND_PREFIX", "CACHE_KIND_MULTIMODAL", "CACHE_KIND_ENCODER"]


# --------------------------------------------- the delta encoding, no server


def _encode_only(trainer: Path, out: Path, *args) -> tuple[bytes, dict]:
    """`rollout_trainer --encode-only OUT ...`: (its SPARSE_XOR16 or XOR8 bytes, its summary)."""
    p = _run([trainer, "--encode-only", out, *args], timeout=120)
    return out.read_bytes(), json.loads(p.stdout.strip().splitlines()[-1])


def _python_payload(base: bytes, new: bytes, encoding: str = "xor16") -> bytes:
    """rollout_codecs.delta's bytes, the compiled and the numpy loops agreeing."""
    enc = delta.SPARSE8 if encoding == "xor8" else delta.SPARSE
    b, n = delta.elements(base, enc), delta.elements(new, enc)
    payload = delta.encode_sparse(b, n).tobytes()
    assert delta.encode_sparse(b, n, compiled=False).tobytes() == payload
    return payload


def _entries(payload: bytes) -> tuple[np.ndarray, np.ndarray]:
    k = int.from_bytes(payload[:4], "little")
    words = np.frombuffer(payload, dtype="<u2", offset=4)
    return words[:k], words[k:]


def _words_changed(words: int, at: list[int]) -> tuple[bytes, bytes]:
    """Random base words, and the same with the words `at` changed."""
    rng = np.random.default_rng(len(at) * 1000 + words)
    base = rng.integers(0, 1 << 16, size=words, dtype=np.uint16)
    new = base.copy()
    for j in at:
        new[j] ^= 1 + j % 0xFFFF  # never 0
    return base.astype("<u2").tobytes(), new.astype("<u2").tobytes()


@pytest.mark.parametrize(
    ("words", "at"),
    [
        (200_000, [3, 150_000]),  # two changes far apart: bridged by entries with x = 0
        (200_000, [65_534, 131_070, 131_071, 199_999]),  # gaps of exactly 65535 and 65536
        (70_000, [0, 65_536]),  # the first word, then a gap of 65536
        (100_000, []),  # nothing changed: K = 0
        (0, []),  # an empty tensor
        (1000, list(range(1000))),  # every word
    ],
    ids=["far-apart", "gap-edges", "first-word", "no-change", "empty", "every-word"],
)
def test_cpp_sparse_xor16_bytes_match_python(trainer, tmp_path, words, at):
    base, new = _words_changed(words, at)
    (tmp_path / "base.bin").write_bytes(base)
    (tmp_path / "new.bin").write_bytes(new)
    payload, out = _encode_only(
        trainer, tmp_path / "out.bin",
        "--base-file", tmp_path / "base.bin", "--new-file", tmp_path / "new.bin",
    )  # fmt: skip
    assert payload == _python_payload(base, new)
    values, gaps = _entries(payload)
    assert out["entries"] == len(values) and out["changed_elements"] == len(at)
    assert out["encoded_bytes"] == len(payload) <= delta.sparse_bound(len(new))
    assert (out["raw_bytes"], out["elements"]) == (len(new), words)
    assert (out["base_crc32c"], out["crc32c"]) == (crc32c.crc32c(base), crc32c.crc32c(new))
    # Decoded, the bytes give the new tensor back.
    target = np.frombuffer(base, dtype="<u2").copy()
    delta.apply_sparse(target, payload)
    assert target.tobytes() == new
    if at:  # one entry per change, plus one bridge per 65535 words beyond the first
        assert len(values) == len(at) + sum((b - a - 1) // 0xFFFF for a, b in zip([-1, *at], at))
        assert list(values[gaps == 0xFFFF]).count(0) >= len(values) - len(at)
    else:
        assert payload == b"\0\0\0\0"


@pytest.mark.parametrize(("nbytes", "at"), XOR8_CASES)
def test_cpp_sparse_xor8_bytes_match_python(trainer, tmp_path, nbytes, at):
    base, changed = xor8_case(nbytes, at)
    (tmp_path / "base.bin").write_bytes(base.tobytes())
    (tmp_path / "new.bin").write_bytes(changed.tobytes())
    payload, out = _encode_only(
        trainer, tmp_path / "out.bin", "--encoding", "xor8",
        "--base-file", tmp_path / "base.bin", "--new-file", tmp_path / "new.bin",
    )  # fmt: skip
    assert payload == _python_payload(base.tobytes(), changed.tobytes(), "xor8")
    assert out["encoding"] == "TENSOR_ENCODING_SPARSE_XOR8"
    assert (out["elements"], out["changed_elements"]) == (nbytes, len(at))
    k = out["entries"]
    assert out["encoded_bytes"] == len(payload) == 4 + 2 * k
    assert k == xor8_entries(at)
    target = base.copy()
    delta.apply_sparse(target, payload)
    assert target.tobytes() == changed.tobytes()


_DTYPES = {
    "bf16": pb.D_TYPE_BFLOAT16,
    "fp16": pb.D_TYPE_FLOAT16,
    "fp32": pb.D_TYPE_FLOAT32,
    "fp64": pb.D_TYPE_FLOAT64,
}


@pytest.mark.parametrize("encoding", ["xor16", "xor8"])
@pytest.mark.parametrize(
    ("name", "dtype", "elements", "base_seed", "seed", "percent"),
    [
        ("model.norm.weight", "bf16", 128, 1, 2, 5),
        ("model.layers.0.mlp.down_proj.weight", "bf16", 32_768, 1, 2, 3),
        ("model.layers.0.mlp.down_proj.weight", "bf16", 400_000, 7, 8, 0.001),  # far apart
        ("model.layers.1.input_layernorm.weight", "fp16", 5000, 3, 4, 50),
        ("lm_head.weight", "fp32", 3000, 11, 12, 100),
        ("model.norm.weight", "bf16", 128, 1, 2, 0),  # nothing picked: K = 0
        ("model.norm.weight", "fp64", 128, 9, 9, 7),  # the same seed: nothing changes
    ],
)
def test_cpp_delta_rule_and_encoding_match_python(
    trainer, tmp_path, name, dtype, elements, base_seed, seed, percent, encoding
):
    """The delta-mode bytes the program derives (the documented rule), and
    their encoding, as this file recomputes them and rollout_client encodes them."""
    payload, out = _encode_only(
        trainer, tmp_path / "out.bin", "--tensor", name, "--dtype", dtype,
        "--elements", elements, "--base-seed", base_seed, "--seed", seed,
        "--change-percent", percent, "--encoding", encoding,
    )  # fmt: skip
    pb_dtype = _DTYPES[dtype]
    base = _tensor_bytes(_as_tensor(_values(name, elements, base_seed), pb_dtype, [elements]))
    values = _changed_values(name, elements, base_seed, seed, percent)
    new = _tensor_bytes(_as_tensor(values, pb_dtype, [elements]))
    assert out["base_crc32c"] == crc32c.crc32c(base)
    assert out["crc32c"] == crc32c.crc32c(new)
    assert out["picked_elements"] == int(_picked(name, elements, seed, percent).sum())
    assert payload == _python_payload(base, new, encoding)
    if percent == 0 or seed == base_seed:
        assert payload == b"\0\0\0\0" and out["changed_elements"] == 0
    elif percent < 1 and encoding == "xor16":
        values_, gaps = _entries(payload)
        assert 0 < out["changed_elements"] < 10 and 0 in values_[gaps == 0xFFFF], "no bridge"
    elif percent < 100:  # about `percent` of the elements picked
        assert abs(out["picked_elements"] / elements - percent / 100) < 0.25 * percent / 100 + 0.01


# --------------------------------------------- against the server


def test_cpp_trainer_generates_pushes_weights_and_resets_caches(trainer, secure, admin):
    info = admin.server_info()
    version = f"cpp-{uuid.uuid4().hex[:12]}"
    _, out = _trainer(
        trainer, secure, "--version", version, "--seed", SEED,
        "--prompt-len", PROMPT_LEN, "--max-tokens", MAX_TOKENS,
        "--chunk-bytes", 96,  # several chunks, at offsets that are not element-aligned
    )  # fmt: skip

    assert out["ok"] is True and out["tls"] and out["mutual_tls"] and out["token"]
    assert out["server"]["weight_version"] == info.weight_version
    assert out["server"]["parameters"] == len(info.parameters)
    prompt = out["prompt_token_ids"]
    assert len(prompt) == PROMPT_LEN and all(0 <= t < info.vocab_size for t in prompt)

    before, after, update = out["before"], out["after"], out["update"]
    assert before["weight_version"] == info.weight_version
    assert after["weight_version"] == version
    for g in (before, after):
        assert len(g["token_ids"]) == MAX_TOKENS == len(g["logprobs"])
        assert all(lp <= 0 for lp in g["logprobs"])
        assert g["finish_reason"] == "FINISH_REASON_LENGTH"
    assert after["token_ids"] != before["token_ids"], "the pushed tensor must change the output"

    # What it pushed: one manifest tensor (the final norm), alone in no group.
    manifest = {p.name: p for p in info.parameters}
    grouped = {n for g in info.parameter_groups for n in g.names}
    [pushed] = update["tensors"]
    assert pushed["name"] == "model.norm.weight"
    assert pushed["name"] in manifest and pushed["name"] not in grouped
    spec = manifest[pushed["name"]]
    assert pushed["dtype"] == pb.DType.Name(spec.dtype)
    assert pushed["shape"] == list(spec.shape)
    assert pushed["bytes"] == dtypes.nbytes(spec.dtype, spec.shape)
    assert update["chunks"] == math.ceil(pushed["bytes"] / 96) > 1
    # The same bytes as an independent computation of the documented rule
    # (the server checked the crc32c the program declared).
    new = _new_tensor(spec, SEED)
    assert pushed["crc32c"] == crc32c.crc32c(_tensor_bytes(new))

    ack = update["ack"]
    assert ack["weight_version"] == version
    assert ack["previous_weight_version"] == info.weight_version
    assert ack["tensors_loaded"] == 1 and ack["bytes_received"] == pushed["bytes"]
    assert ack["replayed"] is False
    assert [(c["cache"], c["reset"]) for c in ack["caches_reset"]] == [(c, True) for c in CACHES]
    reset = out["reset_caches"]["results"]
    assert [(c["cache"], c["reset"]) for c in reset] == [(c, True) for c in CACHES]

    # The Python client sees what the C++ client did.
    assert admin.server_info().weight_version == version
    r = _greedy(admin, prompt)
    assert r.weight_version == version
    # The program's last Generate filled the prefix cache; its ResetCaches emptied it ...
    assert r.usage.cached_prompt_tokens == 0
    # ... and the same prompt does hit the cache when nothing resets it.
    assert _greedy(admin, prompt).usage.cached_prompt_tokens > 0
    tokens, logprobs = _tokens_logprobs(r)
    assert tokens == after["token_ids"]
    assert logprobs == pytest.approx(after["logprobs"], abs=1e-5)

    # The output is a function of that one tensor: the checkpoint's norm gives
    # the first output back, the independently computed one the second.
    admin.update_weights({spec.name: _checkpoint_tensor(spec.name)}, f"{version}-restored")
    tokens, logprobs = _tokens_logprobs(_greedy(admin, prompt))
    assert tokens == before["token_ids"]
    assert logprobs == pytest.approx(before["logprobs"], abs=1e-5)
    admin.update_weights({spec.name: new}, f"{version}-python")
    tokens, logprobs = _tokens_logprobs(_greedy(admin, prompt))
    assert tokens == after["token_ids"]
    assert logprobs == pytest.approx(after["logprobs"], abs=1e-5)


@pytest.mark.parametrize(
    ("case", "step", "code"),
    [
        ("no token", "GetServerInfo", "UNAUTHENTICATED"),
        ("no TLS", "Health.Check", "UNAVAILABLE"),  # the server speaks only TLS
    ],
)
def test_cpp_trainer_is_refused_without_credentials(trainer, secure, case, step, code):
    rc, out = _trainer(
        trainer, secure, "--wait-seconds", 3,
        token=None if case == "no token" else ADMIN, tls=case != "no TLS", check=False,
    )  # fmt: skip
    assert rc == 1
    assert (out["ok"], out["step"], out["code"]) == (False, step, code), out


def test_cpp_trainer_with_a_generate_token_may_not_update(trainer, secure, admin):
    served = admin.server_info().weight_version
    rc, out = _trainer(
        trainer, secure, "--version", f"cpp-{uuid.uuid4().hex[:12]}",
        "--token", GENERATE,  # --token wins over ROLLOUT_TOKEN (admin here)
        check=False,
    )  # fmt: skip
    assert rc == 1
    assert (out["ok"], out["step"], out["code"]) == (False, "UpdateWeights", "PERMISSION_DENIED")
    assert "admin" in out["message"] and out["reason"] == "ROLE_DENIED"
    assert admin.server_info().weight_version == served


def test_cpp_trainer_sends_a_whole_parameter_group(trainer, secure, admin):
    """--tensor naming one piece of a fused module sends its whole group."""
    info = admin.server_info()
    group = next(g for g in info.parameter_groups if len(g.names) > 1)
    version = f"cpp-{uuid.uuid4().hex[:12]}"
    _, out = _trainer(
        trainer, secure, "--version", version, "--seed", 7, "--tensor", group.names[-1],
        "--prompt-len", 8, "--max-tokens", 4,
    )  # fmt: skip
    assert out["ok"] is True
    assert [t["name"] for t in out["update"]["tensors"]] == list(group.names)
    assert out["update"]["ack"]["tensors_loaded"] == len(group.names)
    assert out["after"]["weight_version"] == version == admin.server_info().weight_version


DELTA_TENSOR = "model.layers.1.mlp.down_proj.weight"  # a weight matrix: a realistic delta


def _python_push(
    admin, out: dict, manifest: dict, version: str, base_seed: int, seed: int, percent: float
) -> dict[str, torch.Tensor]:
    """The program's delta-mode tensors, recomputed here and pushed by the
    Python client as a full update (checked against the crc32c it declared)."""
    tensors = {}
    for t in out["update"]["tensors"]:
        new = _delta_tensor(manifest[t["name"]], base_seed, seed, percent)
        assert t["crc32c"] == crc32c.crc32c(_tensor_bytes(new)), t["name"]
        tensors[t["name"]] = new
    assert admin.update_weights(tensors, version).weight_version == version
    return tensors


def _same_output(admin, prompt: list[int], generation: dict) -> None:
    tokens, logprobs = _tokens_logprobs(_greedy(admin, prompt))
    assert tokens == generation["token_ids"]
    assert logprobs == pytest.approx(generation["logprobs"], abs=1e-5)


@pytest.mark.parametrize("encoding", ["xor16", "xor8"])
def test_cpp_trainer_pushes_a_delta(trainer, secure, admin, base_offered, encoding):
    """A full push of seed 1, then a delta of a few percent of its elements
    to seed 2 against it: acknowledged, the new base, and the outputs a full
    push of the same bytes gives."""
    info = admin.server_info()
    manifest = {p.name: p for p in info.parameters}
    version = f"cpp-{uuid.uuid4().hex[:12]}"
    common = ["--tensor", DELTA_TENSOR, "--prompt-len", PROMPT_LEN, "--max-tokens", MAX_TOKENS]
    _, full = _trainer(trainer, secure, "--version", f"{version}-1", "--seed", 1, *common)
    assert full["update"]["delta"] is False and full["update"]["fallback"] == ""
    assert admin.server_info().delta_base_version == f"{version}-1"

    _, out = _trainer(
        trainer, secure, "--version", f"{version}-2", "--base-seed", 1, "--seed", 2,
        "--change-percent", 3, "--chunk-bytes", 1000, "--encoding", encoding, *common,
    )  # fmt: skip
    update = out["update"]
    assert update["delta"] is True, update["fallback"]
    assert (update["base_version"], update["fallback"]) == (f"{version}-1", "")
    assert out["before"]["token_ids"] == full["after"]["token_ids"]  # on seed 1's bytes
    names = [t["name"] for t in update["tensors"]]
    assert DELTA_TENSOR in names
    for t in update["tensors"]:
        spec = manifest[t["name"]]
        assert t["bytes"] == dtypes.nbytes(spec.dtype, spec.shape)
        changed = t["changed_elements"]
        if encoding == "xor16":
            assert t["encoding"] == "TENSOR_ENCODING_SPARSE_XOR16"
            # A few percent of the words (no gap over 65535 words in these tensors).
            assert 0 < changed <= t["picked_elements"] < t["bytes"] // 2 // 10
            assert t["encoded_bytes"] == 4 + 4 * changed < t["bytes"] // 5
        else:
            assert t["encoding"] == "TENSOR_ENCODING_SPARSE_XOR8"
            # Each changed word flips one byte or both; a gap over 255 bytes adds bridges.
            assert 0 < changed <= 2 * t["picked_elements"] < t["bytes"] // 10
            assert 4 + 2 * changed <= t["encoded_bytes"] < t["bytes"] // 10
    assert update["raw_bytes"] == sum(t["bytes"] for t in update["tensors"])
    assert update["encoded_bytes"] == sum(t["encoded_bytes"] for t in update["tensors"])
    assert update["chunks"] == sum(math.ceil(t["encoded_bytes"] / 1000) for t in update["tensors"])
    ack = update["ack"]
    assert (ack["weight_version"], ack["previous_weight_version"]) == (
        f"{version}-2",
        f"{version}-1",
    )
    assert ack["tensors_loaded"] == len(names)
    assert ack["bytes_received"] == update["encoded_bytes"]  # only the encoded bytes travelled
    now = admin.server_info()
    assert (now.weight_version, now.delta_base_version) == (f"{version}-2", f"{version}-2")
    assert out["after"]["weight_version"] == f"{version}-2"
    # The change is visible: not the output of seed 1's bytes.
    assert out["after"]["logprobs"] != full["after"]["logprobs"]
    _same_output(admin, out["prompt_token_ids"], out["after"])

    # The same bytes, recomputed here and pushed in full by the Python client.
    _python_push(admin, out, manifest, f"{version}-python", 1, 2, 3)
    _same_output(admin, out["prompt_token_ids"], out["after"])


def test_cpp_trainer_delta_falls_back_when_the_base_is_refused(
    trainer, secure, admin, base_offered
):
    """A delta naming a base the server does not hold is refused
    (DELTA_BASE_MISMATCH); the program pushes the same new bytes in full."""
    manifest = {p.name: p for p in admin.server_info().parameters}
    version = f"cpp-{uuid.uuid4().hex[:12]}"
    _, out = _trainer(
        trainer, secure, "--version", version, "--tensor", DELTA_TENSOR,
        "--base-seed", 2, "--seed", 3, "--change-percent", 3,
        "--base-version", f"{version}-never-served",
        "--prompt-len", PROMPT_LEN, "--max-tokens", MAX_TOKENS,
    )  # fmt: skip
    update = out["update"]
    assert update["delta"] is False and update["base_version"] == ""
    assert (
        "DELTA_BASE_MISMATCH" in update["fallback"] and "FAILED_PRECONDITION" in update["fallback"]
    )
    assert f"{version}-never-served" in update["fallback"]
    for t in update["tensors"]:
        assert t["encoding"] == "TENSOR_ENCODING_RAW" and t["encoded_bytes"] == t["bytes"]
    assert update["encoded_bytes"] == update["raw_bytes"] == update["ack"]["bytes_received"]
    assert update["ack"]["weight_version"] == version
    now = admin.server_info()
    assert (now.weight_version, now.delta_base_version) == (version, version)
    _same_output(admin, out["prompt_token_ids"], out["after"])
    # The weights are the delta rule's: base seed 2 with seed 3's picked elements.
    _python_push(admin, out, manifest, f"{version}-python", 2, 3, 3)
    _same_output(admin, out["prompt_token_ids"], out["after"])


# --------------------------------------------- sessions

TURN_TOKENS = 8
SESSION_PROMPT_LEN = 40


def _session_of(admin, session_id: str) -> Session:
    """The Python client's handle on a session the program opened (admin
    may read and close any caller's)."""
    return Session(admin, pb.OpenSessionResponse(session_id=session_id))


def test_cpp_session_trajectory_is_prompt_turns_and_appended_ids(trainer, secure, admin):
    """One session driven by the program with a generate token over mutual
    TLS: its trajectory is the prompt, turn 1's sampled ids, the appended ids
    and turn 2's sampled ids, with their sources, a loss mask on exactly the
    sampled ones, and the server holds the same."""
    vocab = admin.server_info().vocab_size
    appended = [vocab - 1, 0, 12345 % vocab]  # the vocabulary's edges: held as they are
    _, out = _run_trainer(
        trainer, secure, "--prompt-len", SESSION_PROMPT_LEN, "--max-tokens", TURN_TOKENS,
        "--append-ids", ",".join(map(str, appended)), "--keep-open",
        subcommand=["session"], token=GENERATE,
    )  # fmt: skip
    assert out["ok"] is True and out["closed"] is False
    held = _session_of(admin, out["session_id"])
    try:
        prompt = [(31 * i + 7) % vocab for i in range(SESSION_PROMPT_LEN)]  # the documented rule
        assert out["prompt_token_ids"] == prompt
        first, second = out["turns"]
        for turn in (first, second):
            assert len(turn["token_ids"]) == TURN_TOKENS == len(turn["logprobs"])
            assert turn["finish_reason"] == "FINISH_REASON_LENGTH"
            assert turn["generation_prompt_token_ids"] == []  # an ids session: nothing rendered
            assert turn["weight_version"] == out["weight_version"]
        assert out["appended"]["token_ids"] == appended
        before_second = len(prompt) + TURN_TOKENS + len(appended)
        assert out["appended"]["total_tokens"] == before_second
        # Turn 2 was conditioned on everything held before it.
        assert second["prompt_tokens"] == before_second

        t = out["trajectory"]
        runs = [
            ("PROMPT", prompt),
            ("SAMPLED", first["token_ids"]),
            ("APPENDED", appended),
            ("SAMPLED", second["token_ids"]),
        ]
        assert t["token_ids"] == [tok for _, ids in runs for tok in ids]
        assert t["sources"] == [f"TOKEN_SOURCE_{src}" for src, ids in runs for _ in ids]
        assert t["loss_mask"] == [int(src == "SAMPLED") for src, ids in runs for _ in ids]
        assert sum(t["loss_mask"]) == 2 * TURN_TOKENS
        sampled_logprobs = [lp for i, lp in enumerate(t["logprobs"]) if t["loss_mask"][i]]
        assert sampled_logprobs == pytest.approx(first["logprobs"] + second["logprobs"], abs=1e-6)
        assert all(lp == 0 for i, lp in enumerate(t["logprobs"]) if not t["loss_mask"][i])
        starts = [0, len(prompt), len(prompt) + TURN_TOKENS, before_second]
        assert [(g["source"], g["start"], g["count"]) for g in t["segments"]] == [
            (f"TOKEN_SOURCE_{src}", start, len(ids)) for (src, ids), start in zip(runs, starts)
        ]
        assert [(v["start"], v["count"]) for v in t["version_spans"]] == [
            (len(prompt), TURN_TOKENS),
            (before_second, TURN_TOKENS),
        ]

        # The server holds what the program printed.
        served = held.trajectory()
        assert list(served.token_ids) == t["token_ids"]
        assert [pb.TokenSource.Name(src) for src in served.sources] == t["sources"]
        assert loss_mask(served) == t["loss_mask"]
        assert list(served.logprobs) == pytest.approx(t["logprobs"], abs=1e-6)
        # Turn 2 is the model's greedy continuation of exactly those ids.
        history = t["token_ids"][:before_second]
        r = admin.generate(
            prompt_token_ids=history, max_tokens=TURN_TOKENS, temperature=0, ignore_eos=True
        )
        assert list(r.completions[0].token_ids) == second["token_ids"]
    finally:
        held.close()
    with pytest.raises(RolloutError) as e:
        held.trajectory()
    assert (e.value.code, e.value.reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def test_cpp_session_refusal_is_reported_and_the_session_closed(trainer, secure, admin):
    """An appended id outside the vocabulary: INVALID_ARGUMENT naming the
    field, reported with the session's id, exit status 1, and the program
    closed the session it opened."""
    vocab = admin.server_info().vocab_size
    p, out = _run_trainer(
        trainer, secure, "--prompt-len", 8, "--max-tokens", 2, "--append-ids", f"5,{vocab}",
        subcommand=["session"], token=GENERATE, check=False,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert (out["ok"], out["step"], out["code"], out["reason"]) == (
        False,
        "AppendToSession",
        "INVALID_ARGUMENT",
        "INVALID_FIELD",
    ), out
    assert out["message"].startswith("token_ids[1]"), out["message"]
    assert "AppendToSession failed: INVALID_ARGUMENT: token_ids[1]" in p.stderr
    with pytest.raises(RolloutError) as e:
        _session_of(admin, out["session_id"]).trajectory()
    assert (e.value.code, e.value.reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")

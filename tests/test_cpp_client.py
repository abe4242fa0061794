"""The C++ trainer client (client/cpp) end to end: builds it with CMake
(stubs generated from the proto at build time by protoc + grpc_cpp_plugin),
runs it against a real server over mutual TLS with a bearer token, and checks
what it did through the Python client.

The server is the test's own (TLS and tokens on), so the weights the program
pushes do not reach the session server that other tests share."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import crc32c
import pytest
import torch

from rollout_client import RolloutClient, dtypes, pb
from tests.support.tokens import ADMIN, GENERATE

CPP_DIR = Path(__file__).resolve().parents[1] / "client" / "cpp"
BUILD_DIR = CPP_DIR / "build"
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
    """client/cpp built into client/cpp/build (incremental on re-runs)."""
    missing = [
        t for t in ("cmake", "make", "c++", "protoc", "grpc_cpp_plugin") if not shutil.which(t)
    ]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: the C++ client test needs Debian's g++, make, "
            "cmake, protobuf-compiler, protobuf-compiler-grpc, libprotobuf-dev and "
            "libgrpc++-dev (run scripts/setup-native, or scripts/setup --dev)",
            pytrace=False,
        )
    cache = BUILD_DIR / "CMakeCache.txt"
    if cache.exists() and f"CMAKE_HOME_DIRECTORY:INTERNAL={CPP_DIR}\n" not in cache.read_text():
        shutil.rmtree(BUILD_DIR)  # configured for a copy of the repository elsewhere
    _run(["cmake", "-S", CPP_DIR, "-B", BUILD_DIR], timeout=300)
    _run(["cmake", "--build", BUILD_DIR, "-j2"], timeout=900)
    binary = BUILD_DIR / "rollout_trainer"
    assert os.access(binary, os.X_OK), binary
    return binary


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


def _trainer(trainer, secure, *args, token: str | None = ADMIN, tls: bool = True, check=True):
    """Runs the program; returns (exit status, its JSON summary)."""
    proc, _, flags = secure
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TOKEN"}
    if token is not None:
        env["ROLLOUT_TOKEN"] = token  # the environment route; --token is the other
    p = _run(
        [trainer, "--target", proc.target, *(flags if tls else []), *args],
        timeout=600,
        env=env,
        check=check,
    )
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert lines, f"the program printed nothing\n--- stderr\n{p.stderr}"
    return p.returncode, json.loads(lines[-1])


# The program's new tensor values, recomputed here from its documented rule
# (client/cpp/rollout_trainer.cc, NewValues): a second implementation.
_M = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _fnv1a64(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & _M
    return h


def _new_tensor(spec: pb.TensorSpec, seed: int) -> torch.Tensor:
    name = spec.name
    norm = name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name
    state = (seed * _GOLDEN + _fnv1a64(name)) & _M
    values = []
    for _ in range(math.prod(spec.shape)):
        state = (state + _GOLDEN) & _M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
        z ^= z >> 31
        k = z % 97 - 48
        values.append(1 + k / 64 if norm else k / 1024)
    dtype = getattr(torch, dtypes.torch_name(spec.dtype))
    return torch.tensor(values, dtype=torch.float64).to(dtype).reshape(list(spec.shape))


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _checkpoint_tensor(name: str) -> torch.Tensor:
    from safetensors import safe_open

    from rollout_service.tiny_models import ensure_model

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

"""Delta codecs for weight sync (issue 25), timed against the ceilings they
compete with (memcpy, XOR, CRC-32C), in one run. No server, no gRPC.

A trainer keeps fp32 master weights and serves bf16; one Adam step at RL
learning rates flips a small share of the bf16 values. This simulates that
(PARAMS fp32 weights ~ N(0, 0.02), torch.optim.Adam with default betas,
fresh gradients ~ N(0, 1e-3) every step, STEPS steps per lr), then encodes
each step's bf16 against the step before with every candidate below, checks
that decoding gives the new bf16 back bit for bit, and prints per lr the
size (% of the bf16 bytes) and the single-core speeds (GB/s of bf16 bytes),
then the end-to-end time of each codec for a 2 GB model over a 1.5 GB/s wire.

    .venv/bin/python -m benchmarks.delta_codecs [--params 16M] [--steps 5] [--repeat 3]

Every payload is defined byte for byte on X = new XOR prev, taken over the
tensor's uint16 bit patterns (little-endian, row-major), so a trainer in any
language can produce it:

- xor+C: C's standard frame of X's 2N bytes (zlib RFC 1950, zstd RFC 8878,
  LZ4 frame format); the level is the encoder's choice, not the format's.
- planes+C: C's frame of X's high bytes (N of them) followed by its low
  bytes (N). The high byte of a bf16 is its sign and 7 exponent bits, and
  is nearly always unchanged: that half is mostly zeros.
- sparse-varint: u32le K (changed values), then their K XORs as u16le in
  position order, then K gaps as LEB128 varints (protobuf's varint): gap_0 =
  p_0 + 1, gap_i = p_i - p_{i-1}. "+zstd1" is a zstd frame of all of it.
- sparse-u16: the same with each gap a u16le; a gap over 65535 is split by
  entries whose XOR is 0 (no-ops), so the decoder has no escape to handle.

Decoding is timed into a fresh copy of prev (a warm buffer: "dec GB/s"), and
in place on a buffer holding prev ("in place"), single-threaded. What numpy
does here in passes, C++ does in one: XOR, the plane split and the sparse
encoder's compare-and-compress (AVX-512 vpcompressw) are SIMD loops; the
gap prefix sum and the scatter are scalar loops over the K entries only;
LEB128 is scalar but branch-light (or SIMD as in masked-VByte); a dense
codec's decoder can XOR each decompressed block into prev while in cache.
The Python codec APIs return fresh bytes objects (zstd is read into a warm
buffer here, lz4 and zlib cannot be).

Run it with nothing else on the machine; best of REPEAT timings per step.
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lz4.frame
import numpy as np
import torch
import zstandard

try:
    import crc32c as _crc32c

    CRC_NAME = f"crc32c {getattr(_crc32c, '__version__', '?')}"

    def crc(data: Any) -> int:
        return _crc32c.crc32c(data)

except ImportError:  # pragma: no cover - the server depends on crc32c
    import google_crc32c as _g

    CRC_NAME = f"google_crc32c {getattr(_g, '__version__', '?')}"

    def crc(data: Any) -> int:
        return _g.value(bytes(data))


LRS = (1e-6, 3e-6, 1e-5)
MODEL_BYTES = 2e9  # the summary's model
WIRE = 1.5e9  # the summary's wire, bytes/s
LZ4_FAST = -8  # lz4.frame: a negative level is LZ4's "fast" acceleration


def simulate(n: int, lr: float, steps: int, seed: int = 0) -> list[np.ndarray]:
    """The served bf16 (uint16 bit patterns) before step 1 and after each step."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(n, generator=g) * 0.02)
    opt = torch.optim.Adam([w], lr=lr)

    def bf16() -> np.ndarray:
        return w.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()

    out = [bf16()]
    for _ in range(steps):
        w.grad = torch.randn(n, generator=g) * 1e-3
        opt.step()
        out.append(bf16())
    return out


# -- numpy pieces ------------------------------------------------------------


def varint_encode(v: np.ndarray) -> np.ndarray:
    """LEB128 of each value of v (uint32 range), concatenated."""
    v = v.astype(np.uint32)
    n = np.ones(len(v), np.int64)  # bytes per value
    for k in range(1, 5):
        n += v >= (1 << (7 * k))
    ends = np.cumsum(n)
    starts = ends - n
    out = np.empty(int(ends[-1]) if len(v) else 0, np.uint8)
    out[starts] = (v & 0x7F) | np.where(n > 1, 0x80, 0)
    for k in range(1, 5):
        m = n > k
        if not m.any():
            break
        vm = v[m] >> (7 * k)
        out[starts[m] + k] = (vm & 0x7F) | np.where(n[m] > k + 1, 0x80, 0)
    return out


def varint_decode(b: np.ndarray, count: int) -> np.ndarray:
    ends = np.flatnonzero(b < 0x80)  # each value's last byte
    if len(ends) != count or (count and ends[-1] != len(b) - 1):
        raise ValueError("bad varint section")
    if count == len(b):  # every gap under 128
        return b.astype(np.uint32)
    lengths = np.diff(ends, prepend=-1)
    v = b[ends].astype(np.uint32)
    for j in range(1, int(lengths.max())):
        m = lengths > j
        v[m] = (v[m] << 7) | (b[ends[m] - j] & 0x7F)
    return v


def planes(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = len(x)
    pairs = x.view(np.uint8).reshape(n, 2)  # little-endian: [low, high]
    out[:n] = pairs[:, 1]
    out[n:] = pairs[:, 0]
    return out


def unplanes(p: np.ndarray, out: np.ndarray) -> np.ndarray:
    n = len(out)
    pairs = out.view(np.uint8).reshape(n, 2)
    pairs[:, 1] = p[:n]
    pairs[:, 0] = p[n:]
    return out


# -- codecs --------------------------------------------------------------------


class Scratch:
    """Warm buffers reused across calls (what a server would keep)."""

    def __init__(self, n: int) -> None:
        self.x = np.ones(n, np.uint16)
        self.p = np.ones(2 * n, np.uint8)
        self.raw = bytearray(2 * n)
        self.raw[:] = b"\1" * (2 * n)


@dataclass
class Codec:
    name: str
    # encode(prev, new, scratch) -> payload
    encode: Callable[[np.ndarray, np.ndarray, Scratch], bytes]
    # apply(payload, buf, scratch): buf holds prev, is turned into new
    apply: Callable[[bytes, np.ndarray, Scratch], None]


def zstd_into(payload: bytes, dst: bytearray) -> memoryview:
    with zstandard.ZstdDecompressor().stream_reader(payload) as r:
        got = r.readinto(dst)
    return memoryview(dst)[:got]


def dense(name: str, comp, decomp, use_planes: bool) -> Codec:
    def encode(prev, new, s: Scratch) -> bytes:
        x = np.bitwise_xor(new, prev, out=s.x)
        return comp(planes(x, s.p) if use_planes else x)

    def apply(payload, buf, s: Scratch) -> None:
        raw = np.frombuffer(decomp(payload, s.raw), np.uint8)
        if use_planes:
            x = unplanes(raw, s.x)
        else:
            x = raw.view(np.uint16)
        np.bitwise_xor(buf, x, out=buf)

    return Codec(name, encode, apply)


def sparse(name: str, gaps: str, zstd_level: int | None) -> Codec:
    cctx = zstandard.ZstdCompressor(level=zstd_level or 1)

    def encode(prev, new, s: Scratch) -> bytes:
        # numpy's nonzero runs ~3x faster over a bool mask than over uint16.
        pos = np.flatnonzero(new != prev)
        vals = new[pos] ^ prev[pos]
        gap = np.diff(pos, prepend=-1)
        if gaps == "u16":
            big = gap > 0xFFFF
            if big.any():  # split with no-op entries (XOR 0)
                fill = (gap - 1) // 0xFFFF
                reps = fill + 1
                at = np.repeat(np.cumsum(reps) - reps, reps)
                k = np.arange(len(at)) - at  # 0..fill within each original gap
                last = k == np.repeat(fill, reps)
                gap = np.where(last, gap.repeat(reps) - fill.repeat(reps) * 0xFFFF, 0xFFFF)
                vals = np.where(last, vals.repeat(reps), 0).astype(np.uint16)
            gap_bytes = gap.astype("<u2").tobytes()
        else:
            gap_bytes = varint_encode(gap).tobytes()
        body = np.uint32(len(vals)).tobytes() + vals.astype("<u2").tobytes() + gap_bytes
        return cctx.compress(body) if zstd_level else body

    def apply(payload, buf, s: Scratch) -> None:
        body = np.frombuffer(zstd_into(payload, s.raw) if zstd_level else payload, np.uint8)
        k = int(body[:4].view("<u4")[0])
        vals = body[4 : 4 + 2 * k].view("<u2")
        rest = body[4 + 2 * k :]
        if gaps == "u16" and len(rest) != 2 * k:
            raise ValueError("bad gap section")
        gap = rest.view("<u2") if gaps == "u16" else varint_decode(rest, k)
        pos = np.cumsum(gap, dtype=np.int64) - 1
        if k and pos[-1] >= len(buf):  # positions increase: one bound check
            raise ValueError("position past the tensor's end")
        buf[pos] ^= vals

    return Codec(name, encode, apply)


def codecs() -> list[Codec]:
    z1, z3 = zstandard.ZstdCompressor(level=1), zstandard.ZstdCompressor(level=3)

    def zstd_dec(p, raw):
        return zstd_into(p, raw)

    def lz4_dec(p, raw):
        return lz4.frame.decompress(p)

    def zlib_dec(p, raw):
        return zlib.decompress(p)

    return [
        dense("xor+zlib1 (issue)", lambda b: zlib.compress(b, 1), zlib_dec, False),
        dense("xor+zstd1", z1.compress, zstd_dec, False),
        dense("xor+zstd3", z3.compress, zstd_dec, False),
        dense("xor+lz4", lz4.frame.compress, lz4_dec, False),
        dense(
            f"xor+lz4 fast({-LZ4_FAST})",
            lambda b: lz4.frame.compress(b, compression_level=LZ4_FAST),
            lz4_dec,
            False,
        ),
        dense("planes+zstd1", z1.compress, zstd_dec, True),
        dense("planes+lz4", lz4.frame.compress, lz4_dec, True),
        sparse("sparse-varint", "varint", None),
        sparse("sparse-varint+zstd1", "varint", 1),
        sparse("sparse-u16", "u16", None),
        sparse("sparse-u16+zstd1", "u16", 1),
    ]


def selftest() -> None:
    """Edge cases the simulated steps never reach: no change, a change at
    both ends, gaps over 65535 (u16 no-op entries) and over 2**14 (3-byte
    varints), an XOR with the high byte set."""
    n = 300_000
    prev = np.arange(n, dtype=np.uint16)
    s = Scratch(n)
    buf = np.empty_like(prev)
    for where in ([], [0, n - 1], [5, 70_000, 70_001, 200_000, 299_000]):
        new = prev.copy()
        new[where] ^= np.uint16(0x8001)
        for c in codecs():
            np.copyto(buf, prev)
            c.apply(c.encode(prev, new, s), buf, s)
            assert np.array_equal(buf, new), (c.name, where)


# -- timing ------------------------------------------------------------------


def best(fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None):
    """(result, best wall seconds, CPU seconds of that best run)."""
    result, wall, cpu = None, float("inf"), float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        c0, t0 = time.thread_time(), time.perf_counter()
        result = fn()
        t, c = time.perf_counter() - t0, time.thread_time() - c0
        if t < wall:
            wall, cpu = t, c
    return result, wall, cpu


@dataclass
class Row:
    sizes: list[float] = field(default_factory=list)  # fraction of bf16 bytes, per step
    enc: float = 0.0  # seconds, summed over steps
    dec: float = 0.0
    dec_cpu: float = 0.0
    inplace: float = 0.0


def ceilings(n: int, repeat: int) -> dict[str, float]:
    """GB/s of memcpy, XOR and CRC-32C over an n-value bf16 buffer."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b = a.copy()
    b[::37] ^= 1
    out = np.ones_like(a)
    gb = a.nbytes / 1e9
    r = max(repeat, 5)
    return {
        "memcpy (numpy copyto, warm)": gb / best(lambda: np.copyto(out, a), r)[1],
        "XOR (numpy, into warm)": gb / best(lambda: np.bitwise_xor(a, b, out=out), r)[1],
        f"CRC-32C ({CRC_NAME})": gb / best(lambda: crc(a), r)[1],
    }


def run_lr(lr: float, n: int, steps: int, repeat: int, s: Scratch) -> tuple[list, dict]:
    seq = simulate(n, lr, steps)
    changed = [np.count_nonzero(seq[i] != seq[i + 1]) / n for i in range(steps)]
    rows: dict[str, Row] = {}
    buf = np.ones(n, np.uint16)
    for c in codecs():
        row = rows.setdefault(c.name, Row())
        for i in range(steps):
            prev, new = seq[i], seq[i + 1]
            payload, t_enc, _ = best(lambda: c.encode(prev, new, s), repeat)  # noqa: B023

            def decode() -> None:
                np.copyto(buf, prev)  # noqa: B023
                c.apply(payload, buf, s)  # noqa: B023

            _, t_dec, c_dec = best(decode, repeat)
            assert np.array_equal(buf, new), (c.name, lr, i)
            _, t_in, _ = best(
                lambda: c.apply(payload, buf, s),  # noqa: B023
                repeat,
                setup=lambda: np.copyto(buf, prev),  # noqa: B023
            )
            assert np.array_equal(buf, new), (c.name, lr, i, "in place")
            row.sizes.append(len(payload) / new.nbytes)
            row.enc += t_enc
            row.dec += t_dec
            row.dec_cpu += c_dec
            row.inplace += t_in
    return changed, rows


def print_lr(lr: float, n: int, steps: int, changed: list[float], rows: dict[str, Row]) -> None:
    gb = 2 * n * steps / 1e9  # bf16 bytes over all steps
    print(
        f"\nlr {lr:g}: values changed, steps 1..{steps}: "
        + ", ".join(f"{c * 100:.1f}" for c in changed)
        + " %"
    )
    print(
        f"{'codec':<22} {'bytes %: step 1':>15} {f'step {steps}':>7} {'mean':>6} "
        f"{'enc GB/s':>9} {'dec GB/s':>9} {'in place':>9} {'dec CPU s/GB':>13}"
    )
    for name, r in rows.items():
        print(
            f"{name:<22} {r.sizes[0] * 100:15.2f} {r.sizes[-1] * 100:7.2f} "
            f"{np.mean(r.sizes) * 100:6.2f} {gb / r.enc:9.2f} {gb / r.dec:9.2f} "
            f"{gb / r.inplace:9.2f} {r.dec_cpu / gb:13.3f}"
        )


def summary(n: int, steps: int, results: dict, ceil: dict[str, float]) -> None:
    gb = 2 * n * steps / 1e9
    crc_rate = next(v for k, v in ceil.items() if k.startswith("CRC"))
    m = MODEL_BYTES
    full = m / WIRE
    check = m / 1e9 / crc_rate
    print(
        f"\nEnd to end, a {m / 1e9:.0f} GB bf16 model over a {WIRE / 1e9:.1f} GB/s wire, one core "
        f"each side, mean step: full push {full:.2f} s (+ {check:.2f} s CRC-32C check).\n"
        "e2e = encode + wire + decode (serial); overlap = max of the three (pipelined by "
        "tensor);\nrecv ratio = (wire + decode + CRC) / (full wire + CRC), target <= 0.2."
    )
    for lr, (_, rows) in results.items():
        print(f"\nlr {lr:g}")
        print(
            f"{'codec':<22} {'max %':>6} {'enc s':>6} {'wire s':>7} {'dec s':>6} {'e2e s':>6} "
            f"{'x full':>7} {'overlap s':>9} {'recv ratio':>10}"
        )
        ranked, small, meets = [], [], []
        for name, r in rows.items():
            enc, dec = m * r.enc / gb / 1e9, m * r.dec / gb / 1e9
            wire = float(np.mean(r.sizes)) * full
            e2e = enc + wire + dec
            ratio = (wire + dec + check) / (full + check)
            ranked.append((e2e, name))
            if max(r.sizes) <= 0.05:
                small.append((e2e, name))
                if ratio <= 0.2:
                    meets.append(name)
            print(
                f"{name:<22} {max(r.sizes) * 100:6.2f} {enc:6.3f} {wire:7.3f} {dec:6.3f} "
                f"{e2e:6.3f} {e2e / full:7.3f} {max(enc, wire, dec):9.3f} {ratio:10.3f}"
            )
        ranked.sort()
        small.sort()
        print(f"fastest end to end: {ranked[0][1]} ({ranked[0][0]:.3f} s vs full {full:.2f} s)")
        if small:
            print(f"fastest with every step <= 5 %: {small[0][1]} ({small[0][0]:.3f} s)")
        print(f"max % <= 5 and recv ratio <= 0.2: {', '.join(meets) or 'none'}")


def parse_count(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.delta_codecs")
    ap.add_argument("--params", type=parse_count, default=16 << 20, help="weights, e.g. 16M")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="timings per step; the best is kept")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n, t0 = args.params, time.perf_counter()
    print(
        f"{n / 2**20:g}M weights ({2 * n / 1e6:.1f} MB bf16), {args.steps} steps per lr, "
        f"best of {args.repeat}; zstandard {zstandard.__version__} (libzstd "
        f"{'.'.join(map(str, zstandard.ZSTD_VERSION))}), lz4 {lz4.VERSION} (liblz4 "
        f"{lz4.library_version_string()}), zlib {zlib.ZLIB_RUNTIME_VERSION}, numpy "
        f"{np.__version__}, torch {torch.__version__}"
    )
    ceil = ceilings(n, args.repeat)
    print(f"\nceilings (single core, GB/s of {2 * n / 1e6:.1f} MB):")
    for k, v in ceil.items():
        print(f"  {k:<32} {v:6.2f}")
    selftest()
    s = Scratch(n)
    results = {}
    for lr in LRS:
        changed, rows = run_lr(lr, n, args.steps, args.repeat, s)
        results[lr] = (changed, rows)
        print_lr(lr, n, args.steps, changed, rows)
    summary(n, args.steps, results, ceil)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

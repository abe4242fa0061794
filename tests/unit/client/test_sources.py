"""Weight sources read lazily (no engine): the same bytes as safetensors
and torch give, whatever the source."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from rollout_client import pb
from rollout_codecs.sources import open_source

TENSORS = {
    "w": torch.arange(24, dtype=torch.float32).reshape(4, 6).to(torch.bfloat16),
    "scale": torch.tensor(0.25, dtype=torch.float32),
    "ids": torch.tensor([3, 1, 2], dtype=torch.int64),
    "none": torch.zeros(0, 5, dtype=torch.float16),
}


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def read_all(st, chunk=5) -> bytes:
    return b"".join(bytes(d) for _, d in st.chunks(chunk))


def check(sources):
    by_name = {s.name: s for s in sources}
    assert set(by_name) == set(TENSORS)
    for name, t in TENSORS.items():
        s = by_name[name]
        assert s.shape == list(t.shape) and s.nbytes == len(raw(t))
        assert read_all(s) == raw(t)
        buf = bytearray(s.nbytes)
        s.read_into(0, memoryview(buf))
        assert bytes(buf) == raw(t)
    assert by_name["scale"].dtype == pb.D_TYPE_FLOAT32 and by_name["ids"].dtype == pb.D_TYPE_INT64


def test_a_safetensors_file_is_described_from_its_header(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(TENSORS, path)
    check(open_source(str(path)))


def test_a_folder_of_shards(tmp_path):
    save_file({k: TENSORS[k] for k in ("w", "scale")}, tmp_path / "a.safetensors")
    save_file({k: TENSORS[k] for k in ("ids", "none")}, tmp_path / "b.safetensors")
    check(open_source(tmp_path))


def test_in_memory_tensors_and_a_non_contiguous_one():
    check(open_source(TENSORS))
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    (s,) = open_source({"t": strided})
    assert read_all(s) == raw(strided.contiguous())

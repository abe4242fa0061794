"""Where a server's front-end CPU goes, component by component, from py-spy.

`py-spy record --format raw` samples every thread of the process and writes
one line per distinct stack (root first, `;`-separated) with its count.
Each sample is charged to the first component that claims a frame, reading
from the innermost frame outwards: time in protobuf's C code called from
convert.py or outputs.py is conversion, time in prometheus_client called from the servicer
is metrics. Work that has no Python frame of its own (gRPC's Cython and C
core, asyncio's C internals, a native thread's loop) lands on the frame that
called it: a sample whose innermost frame is the event loop's callback runner
(`Handle._run`) or a thread's `run` is gRPC's core and the loop itself.

benchmarks.compare --profile runs this around each load of this service.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# (component, substrings of a frame), the first match wins, from the
# innermost frame out.
COMPONENTS = [
    (
        "protobuf building (our conversion)",
        ("rollout_service/generation/convert.py", "rollout_service/generation/outputs.py"),
    ),
    ("protobuf (other)", ("google/protobuf",)),
    ("metrics (prometheus, vLLM stat loggers)", ("prometheus_client", "vllm/v1/metrics")),
    ("logging and tracing", ("logging/", "opentelemetry", "rollout_service/ops/tracing.py")),
    ("admission gate", ("rollout_service/engine/gate.py",)),
    (
        "vLLM output processing (detokenizer, logprobs)",
        (
            "vllm/v1/engine/output_processor",
            "vllm/v1/engine/detokenizer",
            "vllm/v1/engine/logprobs",
            "vllm/tokenizers",
            "vllm/logprobs.py",
            "tokenizers/",
            "transformers/",
            "output_handler (vllm/",
        ),
    ),  # fmt: skip
    (
        "vLLM engine-core IPC (msgpack, zmq)",
        ("vllm/v1/serial_utils", "vllm/v1/engine/core_client", "zmq/"),
    ),
    (
        "vLLM requests in (AsyncLLM.generate, add_request)",
        (
            "vllm/v1/engine/input_processor",
            "vllm/renderers",
            "vllm/v1/engine/async_llm",
            "vllm/utils/async_utils",
            "concurrent/futures",
        ),
    ),  # fmt: skip
    ("our servicer and handlers", ("rollout_service/",)),
    ("gRPC Python layer", ("grpc/",)),
    ("event loop polling (epoll)", ("selectors.py",)),
]
# The frames under everything (the server's start-up, the running loop).
ROOTS = ("rollout_service/cli.py", "rollout_service/server.py")
# Charged only when no frame of the stack is any component's.
NATIVE = "gRPC core and the event loop (no Python frame)"
OTHER = "other"


def component_of(frames: list[str]) -> str:
    """The component a sample's stack (root first) is charged to."""
    for frame in reversed(frames):
        if any(r in frame for r in ROOTS):
            continue
        for name, needles in COMPONENTS:
            if any(n in frame for n in needles):
                return name
    leaf = frames[-1] if frames else ""
    return NATIVE if "asyncio/" in leaf or "threading.py" in leaf else OTHER


def split(raw: str) -> dict[str, float]:
    """Shares (summing to 1) of py-spy raw output's samples, by component."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if stack and n.isdigit():
            counts[component_of(stack.split(";"))] += int(n)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}


class Profile:
    """py-spy sampling a process for `seconds`, started now, without
    pausing it (--nonblocking). py-spy itself costs CPU: the load's
    throughput while it runs is not comparable with an unprofiled run."""

    def __init__(self, pid: int, seconds: float, rate: int = 100) -> None:
        self.out = Path(tempfile.mkstemp(prefix="py-spy-", suffix=".txt")[1])
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(pid),
             "-d", str(max(int(seconds), 1)), "-r", str(rate), "-f", "raw",
             "-o", str(self.out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def shares(self) -> dict[str, float]:
        """Waits for py-spy to finish; the component shares it sampled."""
        _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"py-spy failed ({self.proc.returncode}): {err.decode()[-500:]}")
        return split(self.out.read_text())


def format_split(front_cpu_s_per_1k: float, shares: dict[str, float]) -> str:
    """Lines of CPU seconds per 1,000 output tokens by component."""
    return "\n".join(
        f"    {share * front_cpu_s_per_1k:7.4f}  {share:6.1%}  {name}"
        for name, share in shares.items()
    )

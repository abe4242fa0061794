"""What the load test adds to Locust's report: each call as a request event
(Locust's documented pattern for protocols other than HTTP), the watcher's
verdicts as an entry of their own, and output tokens per second.

Locust's `response_length` of a generation entry is its output tokens, so the
report's "Average size" column reads tokens per call. Token counts travel from
workers to the master with Locust's regular reports (`report_to_master`,
`worker_report`), so a distributed run's total is the sum of its workers'. The
total is printed when Locust quits, and written beside the CSV report
(`<prefix>_tokens.csv`) when `--csv` is given.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_client.load.watcher import Sent, Verdict, Watcher

log = logging.getLogger("rollout_client.load")

WATCHER = "watcher"  # the request_type of the watcher's entries


class StaleTokens(AssertionError):
    """A response carried tokens of weights older than an acknowledged update."""


class TrajectoryMismatch(AssertionError):
    """A session's trajectory disagrees with what its calls returned."""


class CallFailed(Exception):
    """A call failed and is already in the report as its entry's failure:
    the user ends the task (an episode cannot go on without its session)."""


@dataclass
class Tally:
    """Calls (what `Report.call` timed: not the entries derived from them,
    TTFT, ITL, pauses, the watcher's), their output tokens and stale tokens,
    since the last report to the master (a worker) or since the start (the
    master and a local run: its own plus its workers')."""

    requests: int = 0
    tokens: int = 0
    stale_tokens: int = 0

    def add(self, other: dict[str, int]) -> None:
        self.requests += other.get("requests", 0)
        self.tokens += other.get("tokens", 0)
        self.stale_tokens += other.get("stale_tokens", 0)

    def take(self) -> dict[str, int]:
        out = {"requests": self.requests, "tokens": self.tokens, "stale_tokens": self.stale_tokens}
        self.requests = self.tokens = self.stale_tokens = 0
        return out


@dataclass
class Call:
    """One timed call in progress: what `Report.call` yields. Set `tokens`
    (output tokens) as they come; an exception inside the block is the call's
    failure."""

    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)


class Report:
    """One per Locust process (`Report.of(environment)`): the watcher, the
    tally, and the listeners that report them."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.watcher = Watcher()
        self.tally = Tally()  # what this process has not yet reported
        self.total = Tally()  # the master's (or a local run's) running sum
        self.started: float | None = None
        self.stopped: float | None = None
        events = environment.events
        events.report_to_master.add_listener(self._on_report_to_master)
        events.worker_report.add_listener(self._on_worker_report)
        events.test_start.add_listener(self._on_test_start)
        events.test_stop.add_listener(self._on_test_stop)
        events.quitting.add_listener(self._on_quitting)

    @classmethod
    def of(cls, environment: Any) -> Report:
        report = getattr(environment, "rollout_report", None)
        if not isinstance(report, Report):
            report = cls(environment)
            environment.rollout_report = report
        return report

    # -- firing events -----------------------------------------------------

    def fire(
        self,
        request_type: str,
        name: str,
        seconds: float,
        tokens: int = 0,
        exception: BaseException | None = None,
    ) -> None:
        self.environment.events.request.fire(
            request_type=request_type,
            name=name,
            response_time=seconds * 1000,
            response_length=tokens,
            exception=exception,
            context={},
        )

    @contextmanager
    def call(self, request_type: str, name: str) -> Iterator[Call]:
        """Times the block as one request entry; its output tokens count
        towards the throughput. Exceptions are recorded as the entry's
        failures and raised as CallFailed (the user ends its task)."""
        c = Call()
        try:
            yield c
        except Exception as e:  # every failure is the report's, not the user's
            self.tally.requests += 1
            self.fire(request_type, name, time.perf_counter() - c.started, c.tokens, e)
            raise CallFailed(f"{name}: {e}") from e
        # A call cut short by the run's end (GreenletExit) is in no entry: not counted.
        self.tally.requests += 1
        self.tally.tokens += c.tokens
        self.fire(request_type, name, time.perf_counter() - c.started, c.tokens)

    def verdict(self, name: str, mark: Sent, spans: Iterable[pb.VersionSpan]) -> Verdict:
        """Checks one response's spans; a stale one is a failure of the
        watcher's entry `name` (so the run fails: Locust's exit code on error)."""
        v = self.watcher.check(mark, spans)
        self.tally.stale_tokens += v.stale_tokens
        error = None
        if not v.ok:
            error = StaleTokens(
                f"{v.stale_tokens} of {v.tokens} tokens from {', '.join(v.stale_versions)}, "
                f"sent after push {mark.acks} was acknowledged"
            )
            log.error("watcher: %s: %s", name, error)
        self.fire(WATCHER, name, 0.0, v.tokens, error)
        return v

    def trajectory(self, disagreement: str, name: str = "session trajectory") -> None:
        """The verdict on one session's trajectory ("" when it agrees)."""
        error = TrajectoryMismatch(disagreement) if disagreement else None
        if error:
            log.error("watcher: %s: %s", name, disagreement)
        self.fire(WATCHER, name, 0.0, 0, error)

    # -- listeners ---------------------------------------------------------

    def _on_report_to_master(self, client_id: str, data: dict[str, Any]) -> None:
        taken = self.tally.take()
        self.total.add(taken)  # a worker's own running sum, for its line at the end
        data["rollout"] = taken

    def _on_worker_report(self, client_id: str, data: dict[str, Any]) -> None:
        self.total.add(data.get("rollout", {}))

    def _on_test_start(self, **_: Any) -> None:
        self.started, self.stopped = time.monotonic(), None

    def _on_test_stop(self, **_: Any) -> None:
        self.stopped = time.monotonic()

    def _is_worker(self) -> bool:
        return type(self.environment.runner).__name__ == "WorkerRunner"

    def _on_quitting(self, environment: Any, **_: Any) -> None:
        if self._is_worker():
            log.info(
                "rollout-load worker: %s requests, %s output tokens this process", *self._own()
            )
            return
        self.total.add(self.tally.take())
        t = self.total
        seconds = ((self.stopped or time.monotonic()) - (self.started or time.monotonic())) or 1e-9
        rate = t.tokens / seconds
        log.info(
            "rollout-load: %d requests, %d output tokens in %.1f s: %.1f tokens/s; "
            "stale tokens: %d",
            t.requests,
            t.tokens,
            seconds,
            rate,
            t.stale_tokens,
        )
        prefix = getattr(environment.parsed_options, "csv_prefix", None)
        if prefix:
            with open(f"{prefix}_tokens.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(
                    ["requests", "output_tokens", "seconds", "tokens_per_second", "stale_tokens"]
                )
                w.writerow([t.requests, t.tokens, f"{seconds:.3f}", f"{rate:.2f}", t.stale_tokens])

    def _own(self) -> tuple[int, int]:
        """A worker's own counts since its start (kept apart from its reports)."""
        return self.total.requests + self.tally.requests, self.total.tokens + self.tally.tokens

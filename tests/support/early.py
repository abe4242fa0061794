"""Servers a test module starts for itself, begun before its first test: while
the modules before it run, instead of in its first test's setup (a start is
~25 s, mostly single-threaded imports, which overlap the tests running).

A module declares such a start with `@early(stop=...)` on the function that
launches it, and its fixture calls `take(...)`: what the early start
returned, once it has (its error raised there, so a start that failed fails
the tests that need it, loudly), or, when none was begun (the module runs
alone, say) or it was begun on other arguments, the start done now. The stop
is for a start never taken (a run stopped early); one taken is the fixture's
to stop.

tests/conftest.py begins them in the order the modules run, `AHEAD` at a time
(begun and not yet taken): every server alive is one of the session's, the
running module's, or one of the next `AHEAD` modules'.

A start may need something of the session server (its `parameters`, say, for
weights derived from them): then `prepare=` takes those as keyword arguments
and returns the launch's argument (a checkpoint, say). Begun early, the
preparation runs in a thread of its own (waiting for the session server, from
conftest's `providers`); the fixture passes the values it has, and an early
start on other values is stopped and done again. Launches (the server's
Popen) run on the main thread, between tests, never in a thread: a process
started while a test has patched os.environ would inherit the patch.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Starts begun and not yet taken, at most; see the module's docstring.
AHEAD = 2

_by_module: dict[str, list[Early]] = {}
_lock = threading.RLock()  # the main thread takes it again (early_tmp in a launch)
_queue: list[Early] = []  # to begin, in the order their modules run
_pending: list[Early] = []  # begun, not yet taken
_providers: dict[str, Callable[[], Any]] = {}
_tmp: list[Path] = []


def early_tmp() -> Path:
    """A folder for the session's early starts (certificates, checkpoints),
    removed at its end."""
    with _lock:
        if not _tmp:
            _tmp.append(Path(tempfile.mkdtemp(prefix="rollout-early-")))
            atexit.register(shutil.rmtree, _tmp[0], ignore_errors=True)
        return _tmp[0]


class Early:
    """One start of a test module's, begun early or done at its fixture."""

    def __init__(
        self,
        launch: Callable[..., Any],
        stop: Callable[[Any], None],
        prepare: Callable[..., Any] | None,
    ) -> None:
        self.launch = launch
        self.stop = stop
        self.prepare = prepare
        self.module = launch.__module__
        self.needs = list(inspect.signature(prepare).parameters) if prepare else []
        self._prepared: Future | None = None  # begun: the preparation's (kwargs, result)
        self._launched: Future | None = None  # launched: the launch's result

    def __repr__(self) -> str:
        return f"{self.module}.{self.launch.__name__}"

    def _begin(self) -> None:
        log.info("beginning %r early", self)
        self._prepared = prepared = Future()
        if self.prepare is None:
            prepared.set_result(({}, ()))
            self._launch()
            return
        prepare = self.prepare

        def run() -> None:
            try:
                kwargs = {name: _providers[name]() for name in self.needs}
                prepared.set_result((kwargs, (prepare(**kwargs),)))
            except BaseException as e:  # raised again in the fixture that takes it
                prepared.set_exception(e)

        threading.Thread(target=run, name=f"early {self!r}", daemon=True).start()

    def _launch(self) -> None:
        """The launch, on the main thread, once prepared (its error kept for `take`)."""
        assert self._prepared is not None and self._prepared.done()
        launched: Future = Future()
        try:
            _, args = self._prepared.result()
            launched.set_result(self.launch(*args))
        except BaseException as e:
            launched.set_exception(e)
        self._launched = launched

    def _now(self, kwargs: dict[str, Any]) -> Any:
        args = (self.prepare(**kwargs),) if self.prepare else ()
        return self.launch(*args)

    def take(self, **kwargs: Any) -> Any:
        """The early start's result (waited for), or a start done now."""
        with _lock:
            prepared, self._prepared = self._prepared, None
            launched, self._launched = self._launched, None
            if self in _queue:
                _queue.remove(self)
            if self in _pending:
                _pending.remove(self)
            _refill()
        if prepared is None:
            return self._now(kwargs)
        begun_on, args = prepared.result()  # its preparation's error, if it failed
        if begun_on != kwargs:
            log.warning("%r was begun on other values: starting it again", self)
            if launched is not None:
                self.stop(launched.result())
            return self._now(kwargs)
        if launched is None:
            return self.launch(*args)
        return launched.result()  # its launch's error, if it failed

    def _abandon(self) -> None:
        """Stops what an early launch started, if it was never taken."""
        launched, self._launched = self._launched, None
        if launched is not None and launched.exception() is None:
            self.stop(launched.result())


def early(
    stop: Callable[[Any], None], prepare: Callable[..., Any] | None = None
) -> Callable[[Callable[..., Any]], Early]:
    """Declares a start of the calling test module's (see the module's docstring)."""

    def register(launch: Callable[..., Any]) -> Early:
        e = Early(launch, stop, prepare)
        _by_module.setdefault(e.module, []).append(e)
        return e

    return register


def _refill() -> None:
    while _queue and len(_pending) < AHEAD:
        e = _queue.pop(0)
        _pending.append(e)
        e._begin()


def schedule(modules: list[str], providers: dict[str, Callable[[], Any]]) -> None:
    """Begins the starts of `modules` (in the order they run), `AHEAD` at a
    time; a start needing what `providers` lacks is left to its fixture."""
    with _lock:
        _providers.update(providers)
        _queue[:] = [
            e
            for m in modules
            for e in _by_module.get(m, ())
            if all(n in _providers for n in e.needs)
        ]
        _refill()


def launch_prepared() -> None:
    """Launches every early start whose preparation is done (on the main
    thread, between tests: conftest's pytest_runtest_setup)."""
    with _lock:
        ready = [
            e
            for e in _pending
            if e._launched is None and e._prepared is not None and e._prepared.done()
        ]
    for e in ready:
        e._launch()


def abandon_all() -> None:
    """Stops every early start never taken (at the session's end)."""
    with _lock:
        left = list(_pending)
        _queue.clear()
        _pending.clear()
    for e in left:
        e._abandon()

"""The process: gRPC server, health, reflection, engine, signals, shutdown.

Order matters. The port opens first with health NOT_SERVING, so orchestrators
can watch start-up; SERVING is set only once the engine is up and warm, and
the log says which phase start-up is in and how long each usually takes. On
SIGTERM/SIGINT: NOT_SERVING, refuse new calls UNAVAILABLE and give in-flight
ones the grace period, end what still runs UNAVAILABLE, shut the engine down
(which ends its child processes) and end the process; gRPC itself is never
stopped once it served (rpc/handlers.Ending says why).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import grpc
import psutil
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rollout.v1 import rollout_pb2
from rollout_service.app import build_app
from rollout_service.config import ServerConfig
from rollout_service.engine import (
    compile_cache,
    core_fork,
    parent_watch,
    placement,
    quick_exit,
    worker_fork,
)
from rollout_service.engine.startup import WARM_UP_USUALLY, settle, start_engine
from rollout_service.handoff.region import StagingRegion, StagingSpaceError, remove_stale_segments
from rollout_service.http.front import Front
from rollout_service.http.serve import HttpServer
from rollout_service.ops import grpc_tracing, metrics
from rollout_service.ops.auth import Tokens
from rollout_service.ops.grpc_auth import AuthInterceptor
from rollout_service.ops.grpc_metrics import MetricsInterceptor
from rollout_service.pipeline.serving import App
from rollout_service.rpc.readiness import Serving
from rollout_service.rpc.servicer import add_to_server
from rollout_service.start_checks import in_use, in_use_problem
from rollout_service.status.errors import engine_dead, shutting_down
from rollout_service.update.reservation import reserve_for_checkpoint
from rollout_service.worker.weights_backend import FAULT_FILE_ENV

log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name

# How long the engine core has to exit after its SIGTERM before vLLM kills it
# (and with it the cleanup of its shared memory). It stops its worker in about
# 0.5 s, then exits (engine/quick_exit.py): about a second in all on an idle
# host; on a loaded CI host its teardown took over 8 s, past the 10 s it had.
ENGINE_EXIT_SECONDS = 30.0

# Keepalive (docs/operations.md, "Keepalive"). A unary Generate
# writes nothing until its rollout ends, minutes later, and load balancers,
# meshes and grpc-go/grpc-js users ping such connections every 10 to 60 s.
# gRPC's default server policy counts every ping less than 5 minutes after the
# last as a strike and closes the connection after 2 (GOAWAY
# ENHANCE_YOUR_CALM, "too_many_pings"), failing the call: 10 s pings killed a
# rollout after 40 to 50 s.
KEEPALIVE_OPTIONS = (
    # Pings 5 s apart or more are accepted: half the 10 s floor grpc-go and
    # grpc-java clients enforce, so a 10 s client's timer jitter never counts.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    # Faster pings still count, and the third closes the connection (gRPC's
    # default, stated): a client flooding pings is still cut off.
    ("grpc.http2.max_ping_strikes", 2),
    # Between calls too (gRPC's floor is otherwise 2 hours with no call
    # open): meshes ping idle connections, and a GOAWAY there is churn.
    ("grpc.keepalive_permit_without_calls", 1),
    # The server pings every 30 s itself and closes a connection whose client
    # does not answer within 20 s: the calls of a client host that vanished
    # without closing its sockets are cancelled (their engine requests
    # aborted) within a minute, instead of generating for nobody and holding
    # updates back until the drain deadline. 30 s also keeps a silent call's
    # connection under the 60 s idle timeout common in load balancers.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # grpcio 1.85 closes the connection on this one, not the line above
    # (measured: with only keepalive_timeout_ms a stopped client was still
    # connected after 30 s of a 2 s timeout; the default is 60 s).
    ("grpc.http2.ping_timeout_ms", 20_000),
    # gRPC stops sending pings after 2 with no data between them; without
    # this a silent call would go unwatched after its first minute.
    ("grpc.http2.max_pings_without_data", 0),
)


def _set_health(servicer: health.aio.HealthServicer, serving: bool):
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    return asyncio.gather(servicer.set("", status), servicer.set(SERVICE_NAME, status))


def _add_port(server, config: ServerConfig) -> int:
    address = f"{config.host}:{config.port}"
    if not config.tls_cert:
        return server.add_insecure_port(address)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_server_credentials(
        [(read(config.tls_key), read(config.tls_cert))],
        root_certificates=read(config.tls_client_ca) if config.tls_client_ca else None,
        require_client_auth=bool(config.tls_client_ca),
    )
    return server.add_secure_port(address, creds)


class _Signals:
    """SIGTERM and SIGINT: the first asks for the orderly stop, a second one
    hurries it (a terminal's user presses Ctrl-C twice to mean "now"). The
    engine's start cannot be interrupted (vLLM's constructor blocks until it
    is up): a second signal then exits at once, and the engine's processes
    follow (parent_watch.py). While in-flight calls drain, it ends their
    grace; the engine is still shut down in order."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self.starting = True
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received)

    def _received(self) -> None:
        if not self.stop.is_set():
            self.stop.set()
        elif self.starting:
            log.warning("second signal during start-up: exiting now, the engine's processes follow")
            os._exit(1)
        elif not self.hurry.is_set():
            log.warning("second signal: in-flight calls are ended now, not after their grace")
            self.hurry.set()


async def _watch_engine(engine, every: float) -> None:
    """Returns when the engine is dead (its processes gone or failed)."""
    # vLLM sets `errored` from its own threads and offers no event for it.
    while not engine.errored:  # noqa: ASYNC110
        await asyncio.sleep(every)


async def serve(config: ServerConfig, engine_args) -> int:
    """Runs the server until a signal or the engine's death, then ends the
    process (quick_exit); returns the exit code when it stops before serving."""
    signals = _Signals()
    # Before anything else: the commonest mistake on a first run.
    if problem := in_use_problem(config.host, config.port):
        log.error("cannot start: %s", problem)
        return 1
    # Before the engine: several CPU workers need their cores (placement.py).
    try:
        placement.bind_cpu_workers(engine_args)
    except placement.PlacementError as e:
        log.error("cannot start: %s", e)
        return 1
    remove_stale_segments()
    if fault_file := os.environ.get(FAULT_FILE_ENV):
        log.warning("fault injection armed (%s=%s): for tests only", FAULT_FILE_ENV, fault_file)
    # Engine processes end if this one is killed (parent_watch.py).
    parent_watch.arm()
    # vLLM's saved compiled model fails to load on CPU (compile_cache.py).
    from vllm.platforms import current_platform

    compile_cache.arm(current_platform.is_cpu())
    # The engine core forks its workers: vLLM is not imported twice (worker_fork.py).
    worker_fork.arm()
    # The engine core starts from a copy of this process, taken now while it
    # has one thread: vLLM is not imported again (core_fork.py).
    core_fork.fork_ahead(current_platform.is_cpu())
    # Before anything slow: a /dev/shm too small fails now (reservation.py).
    staging = StagingRegion()
    try:
        reserve_for_checkpoint(staging, engine_args.model, config.max_update_bytes)
    except StagingSpaceError as e:
        log.error("cannot start: %s", e)
        return 1
    options = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        # gRPC sets SO_REUSEPORT by default: a second server started on a
        # busy port would share it, and callers would reach one or the other
        # (an update acknowledged by one, rollouts served by the other on
        # the old weights). A busy port refuses to start instead.
        ("grpc.so_reuseport", 0),
        *KEEPALIVE_OPTIONS,
    ]
    tokens = Tokens.load(config.tokens_file)
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor()]
    # vLLM's --otlp-traces-endpoint; outermost, so refused calls get a span too.
    if (traced := grpc_tracing.setup(engine_args.otlp_traces_endpoint)) is not None:
        interceptors.insert(0, traced)
    if tokens is not None:
        interceptors.append(AuthInterceptor(tokens, config.protect_health))
    server = grpc.aio.server(
        options=options,
        interceptors=interceptors,
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await _set_health(health_servicer, serving=False)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    # Registered now, while the engine starts: its RPCs answer STARTING
    # until `serving.start` (readiness.py).
    serving = Serving(config)
    add_to_server(serving, server)
    try:
        port = _add_port(server, config)
    except RuntimeError as e:  # gRPC's "Failed to bind to address ..."
        log.error(
            "cannot start: %s (or it cannot be bound here: %s)",
            in_use(config.host, config.port),
            e,
        )
        staging.close()
        return 1
    await server.start()
    log.info(
        "listening on %s:%d (%s, auth %s; NOT_SERVING until the engine is warm)",
        config.host,
        port,
        "TLS" if config.tls_cert else "plaintext",
        "on" if tokens else "off",
    )
    if config.metrics_port is not None:
        log.info(
            "metrics on http://%s:%d/metrics",
            config.host,
            metrics.start_http(config.metrics_port, config.host),
        )

    engine = None
    app: App | None = None
    http = None
    # The exit code once it has served (a signal, or the engine died).
    exiting: int | None = None
    try:
        if config.http_port is not None:
            # Beside gRPC, on this loop; 503 (STARTING) until the engine is warm.
            front = Front(
                lambda: serving.ready,
                tokens,
                config.tool_call_parser,
                engine_args.reasoning_parser or None,
            )
            http = HttpServer(front, config)
            try:
                http_port = await http.start()
            except OSError as e:
                log.error("cannot start: --http-port %d: %s", config.http_port, e)
                return 1
            log.info("OpenAI-compatible API on %s:%d (docs/openai.md)", config.host, http_port)
            serving.http_url = http.url(http_port)
        if signals.stop.is_set():
            return 0
        began = time.monotonic()
        engine = await start_engine(engine_args, signals.stop)
        signals.starting = False
        if signals.stop.is_set():
            return 0
        log.info("engine up in %.1f s; warming up: %s", time.monotonic() - began, WARM_UP_USUALLY)
        # Every CPU the process was given, before placement moves it off the
        # worker's: a delta's decode runs on all of them (delta_base.py).
        cpus = os.sched_getaffinity(0)
        placement.apply(config.cpu_placement)
        try:
            app = await build_app(
                engine,
                config,
                staging,
                on_degraded=lambda degraded: _set_health(health_servicer, serving=not degraded),
                cpus=cpus,
            )
        except StagingSpaceError as e:
            log.error("cannot start: %s", e)
            return 1
        serving.start(app)
        metrics.bind(app.gate, app.updater)
        metrics.bind_sessions(app.session_store)
        settle()
        await _set_health(health_servicer, serving=True)
        log.info(
            "SERVING %s on %s:%d (%.0f s after the start)",
            app.info.model,
            config.host,
            port,
            time.time() - psutil.Process().create_time(),
        )
        watchdog = asyncio.ensure_future(_watch_engine(engine, config.watchdog_seconds))
        await asyncio.wait(
            [watchdog, asyncio.ensure_future(signals.stop.wait())], return_when="FIRST_COMPLETED"
        )
        died = watchdog.done()
        watchdog.cancel()
        if died:
            # A supervisor restarts us; a dead engine cannot be revived here.
            log.error("the engine died: NOT_SERVING, exiting with status 1")
        else:
            log.info(
                "shutting down: NOT_SERVING, %.1fs grace for in-flight calls "
                "(a second signal ends it)",
                config.grace_seconds,
            )
        exiting = 1 if died else 0
        await _set_health(health_servicer, serving=False)
        # New calls are refused UNAVAILABLE while those in flight finish (none
        # can once the engine died); what still runs when the grace ends (or at
        # a second signal) is ended UNAVAILABLE too (handlers.Ending says why
        # not gRPC's stop). The HTTP front stops meanwhile.
        ending = serving.ending.stop(
            engine_dead if died else shutting_down,
            0.0 if died else config.grace_seconds,
            signals.hurry,
        )
        await asyncio.gather(ending, *([http.stop()] if http is not None else []))
        http = None
        return exiting
    finally:
        await _set_health(health_servicer, serving=False)
        # Once it served, the server is not stopped: until this process ends
        # (below) it refuses every call UNAVAILABLE, and then its connections
        # close (UNAVAILABLE too). A stop sends GOAWAY and cancels the calls
        # that crossed it on the way in, as returning would (the event loop
        # cancels the calls' tasks): their clients saw CANCELLED, which no
        # retry policy retries (tests/engine/serving/test_shutdown.py,
        # test_faults.py). A stop during start-up still stops it.
        stopping = [] if exiting is not None else [server.stop(config.grace_seconds)]
        if http is not None:
            stopping.append(http.stop())
        await asyncio.gather(*stopping)
        if engine is not None:
            engine.shutdown(timeout=ENGINE_EXIT_SECONDS)
        # After the engine: its workers read the region and the adapters' folder.
        if app is not None:
            app.close()
        staging.close()
        log.info("shutdown complete")
        if exiting is not None:
            quick_exit.end(exiting)

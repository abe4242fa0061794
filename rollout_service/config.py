"""The server's options: one dataclass, and the command line made from it.

Each field's docstring is its `--flag`'s help (as vLLM's FrontendArgs does
for its own server), its default the flag's default and its type the flag's
type, so a flag cannot drift from its field. Comments above a field say why
its default is what it is. A bool that defaults to True becomes `--no-FLAG`.
Engine options are vLLM's own (AsyncEngineArgs), added beside these.
"""

from __future__ import annotations

import ast
import inspect
import types
import typing
from dataclasses import MISSING, dataclass, fields


@dataclass(frozen=True)
class ServerConfig:
    """Server options (engine options are vLLM's own AsyncEngineArgs)."""

    host: str = "127.0.0.1"
    """address to listen on"""
    port: int = 50051
    """port to listen on; 0 picks one"""
    grace_seconds: float = 10.0
    """time in-flight calls get to finish on SIGTERM/SIGINT"""
    max_message_bytes: int = 64 << 20
    """largest gRPC message, both directions (must exceed the chunk size)"""
    # 1 MiB measured fastest per core here (BENCHMARKS.md).
    recommended_chunk_bytes: int = 1 << 20
    """the chunk size GetServerInfo recommends to clients"""
    max_update_bytes: int | None = None
    """largest UpdateWeights payload (default: the model's size plus 25% and 64 MiB)"""
    initial_weight_version: str = "initial"
    """version reported for the weights loaded at start"""
    prefault_staging: bool = True
    """touch the staging memory's pages at start, so the first update is fast too (it is
    reserved either way; without, the first update pays the page faults)"""
    tokens_file: str | None = None
    """enable bearer-token auth: a file of 'role:token' lines, roles generate and admin (or
    set $ROLLOUT_SERVICE_TOKENS='role:token,...'; never on the command line)"""
    protect_health: bool = False
    """require a token for health checking and reflection too"""
    tls_cert: str | None = None
    """PEM server certificate: serve TLS"""
    tls_key: str | None = None
    """PEM private key of --tls-cert"""
    tls_client_ca: str | None = None
    """PEM CA: require client certificates (mutual TLS)"""
    max_concurrent_rpcs: int | None = 1024
    """RPCs of any kind at once; over it gRPC answers RESOURCE_EXHAUSTED"""
    max_queued_generate: int | None = 4096
    """Generate calls running or waiting at the gate; over it RESOURCE_EXHAUSTED"""
    # On by default: the cost is a heap instead of a deque in vLLM's waiting
    # queue (benchmarks/fair_share.py measures it).
    fair_share: bool = True
    """serve callers fairly: each generation's engine priority is its caller's generations in
    flight divided by the caller's share (vLLM's priority scheduling, set with it); off: first
    come, first served, whoever sent them"""
    caller_shares: str = ""
    """weights of callers under --fair-share: comma-separated KEY=N, KEY a role (admin,
    generate; with auth on) or tenant:NAME (the rollout-tenant metadata), N from 1 to 1000;
    callers not named have 1"""
    # Half of --max-queued-generate's default: no one caller takes every place.
    max_requests_per_caller: int | None = 2048
    """generations one caller may have in flight at once; past it RESOURCE_EXHAUSTED
    (CALLER_QUEUE_FULL) with a retry hint"""
    engine_seats_per_caller: int | None = None
    """under --fair-share, engine requests one caller may have at once (default: vLLM's
    max_num_seqs less an eighth, left free so other callers' requests start at once)"""
    # vLLM's own default batch on CPU is 256 sequences: more from one stream
    # would only wait in its queue.
    max_generations_per_stream: int = 256
    """GenerateMany: generations of one stream running at once; later ones wait and the
    stream is not read meanwhile"""
    # The measured cost is in many.py: a few hundred MB at this default with
    # 20 top logprobs. Plain rollouts (no top logprobs) of 2k tokens stay
    # under it up to the 256 generations above.
    max_stream_tokens: int = 1 << 20
    """GenerateMany: a stream's running generations may hold at most this many tokens, each
    counted as max_tokens x n x (1 + logprobs)"""
    max_prompt_tokens: int | None = None
    """longest prompt in tokens (default: what the context allows)"""
    metrics_port: int | None = None
    """serve Prometheus /metrics on this port"""
    # Off unless asked for: a port more to secure, and the gRPC API is the
    # service's own (docs/openai.md says what the HTTP one serves).
    http_port: int | None = None
    """serve the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health; docs/openai.md) on this port, beside gRPC, over the same engine, gate and limits;
    off unless given (0 picks a free port, which the log names)"""
    tool_call_parser: str | None = None
    """vLLM's tool parser (hermes, pythonic, ...) that finds tool calls in chat output for
    tool_choice "auto" on the HTTP API; "required" and a named function need none"""
    cpu_placement: bool = True
    """on a CPU host, move this server and vLLM's engine core off the cores vLLM binds its
    worker to (a no-op on GPU hosts)"""
    # The decode is memory-bound (delta_base.py, delta_load.py).
    delta_decode_threads: int | None = None
    """threads that decode a delta update's tensors (default: one per CPU this process may
    use, up to 8); on a CPU host the first group's include the cores vLLM's worker is bound
    to, idle then, and the others run on the server's own cores while the engine loads"""
    watchdog_seconds: float = 1.0
    """how often the engine's liveness is checked"""
    # Long enough for ordinary rollouts, short enough that a stalled client
    # cannot hold updates back.
    drain_timeout_seconds: float = 120.0
    """longest wait for in-flight Generate calls before an update or cache reset; those still
    running then are aborted"""
    # So that a stalled trainer cannot hold updates back.
    update_idle_timeout_seconds: float = 300.0
    """an open update (staged, or an UpdateWeights stream between two messages) idle for
    longer is discarded"""
    chat_template: str | None = None
    """a Jinja chat template file that replaces the model's own (Generate, Tokenize and
    sessions render chat messages with it)"""
    # A few thousand concurrent trajectories is what one RL job's rollout
    # workers keep open; the token budget below bounds their memory anyway.
    max_sessions: int = 4096
    """sessions open at once over all callers; over it OpenSession is RESOURCE_EXHAUSTED"""
    max_sessions_per_caller: int = 1024
    """sessions one caller (bearer token) may have open at once"""
    # 16 Mi tokens at most 24 bytes each (sessions/trajectory.py): under
    # 400 MB of server memory for every session's history together.
    max_session_tokens: int = 1 << 24
    """the sum of open sessions' token budgets (each reserves its whole budget when it opens)"""
    # Long enough for a slow tool call between two turns, short enough that
    # trajectories a crashed rollout worker left behind are freed.
    session_idle_timeout_seconds: float = 600.0
    """a session with no call for this long expires"""
    weight_broadcast: bool = False
    """with several workers: only the first reads each update from the staging region and
    broadcasts it to the others over vLLM's process group (as workers on other hosts would
    need)"""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after its annotation)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())  # type: ignore[union-attr]
    return docs


def _scalar(annotation) -> type:
    """int for `int | None`, and so on."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def add_server_args(parser) -> None:
    """A `--flag` per ServerConfig field, under the group 'rollout-service'."""
    docs = field_docs(ServerConfig)
    hints = typing.get_type_hints(ServerConfig)
    group = parser.add_argument_group("rollout-service")
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = docs[f.name].replace("%", "%%")  # argparse formats help
        kind = _scalar(hints[f.name])
        if kind is bool:
            if f.default:
                group.add_argument(
                    "--no-" + flag[2:], dest=f.name, action="store_false", help="off: " + help_text
                )
            else:
                group.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        if f.default is not None and f.default is not MISSING:
            help_text += " (default: %(default)s)"
        group.add_argument(flag, dest=f.name, type=kind, default=f.default, help=help_text)


def from_args(args) -> ServerConfig:
    """The config the parsed flags say."""
    return ServerConfig(**{f.name: getattr(args, f.name) for f in fields(ServerConfig)})

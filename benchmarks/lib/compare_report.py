"""What benchmarks.compare reports: each ratio of one configuration's figure
over another's, judged against its target (TARGETS), per round and as the
median over rounds, and the table of every configuration's figures."""

from __future__ import annotations

import statistics

# (name, numerator, denominator, metric, comparison, target)
# fmt: off
TARGETS = [
    ("ours unary / in-process tok/s", "ours_unary", "inprocess_unary", "tok/s", ">=", 0.95),
    ("ours unary / vllm serve tok/s", "ours_unary", "vllm_serve", "tok/s", ">=", 1.1),
    ("ours stream / in-process tok/s", "ours_stream", "inprocess_stream", "tok/s", ">=", 0.9),
    ("ours stream / in-process TTFT p50", "ours_stream", "inprocess_stream", "ttft", "<=", 1.3),
    # Both sides with the same StreamOptions (--tuned-delta-tokens, omit_text).
    ("tuned stream / in-process tok/s", "ours_stream_tuned", "inprocess_stream_tuned", "tok/s",
     ">=", 0.9),
    ("tuned stream / in-process TTFT p50", "ours_stream_tuned", "inprocess_stream_tuned", "ttft",
     "<=", 1.3),
    # No target: the service's own layer, against the thinnest gRPC front end
    # on the same engine (what any Python gRPC server costs is in both).
    ("ours unary / thin gRPC tok/s", "ours_unary", "thin_unary", "tok/s", None, None),
    ("ours stream / thin gRPC tok/s", "ours_stream", "thin_stream", "tok/s", None, None),
    ("ours stream / thin gRPC TTFT p50", "ours_stream", "thin_stream", "ttft", None, None),
    ("tuned stream / thin gRPC tok/s", "ours_stream_tuned", "thin_stream_tuned", "tok/s", None,
     None),
    ("tuned stream / thin gRPC TTFT p50", "ours_stream_tuned", "thin_stream_tuned", "ttft", None,
     None),
    # No target: what a gRPC front end in another process costs on this machine.
    ("thin unary / in-process tok/s", "thin_unary", "inprocess_unary", "tok/s", None, None),
    ("thin stream / in-process tok/s", "thin_stream", "inprocess_stream", "tok/s", None, None),
    ("thin stream / in-process TTFT p50", "thin_stream", "inprocess_stream", "ttft", None, None),
    ("thin tuned / in-process tok/s", "thin_stream_tuned", "inprocess_stream_tuned", "tok/s", None,
     None),
    # No target: front-end CPU per token against in-process's (front end and
    # load client in one process there): what a host with cores to spare gets.
    ("ours unary / in-process front CPU", "ours_unary", "inprocess_unary", "front", None, None),
    ("ours stream / in-process front CPU", "ours_stream", "inprocess_stream", "front", None, None),
    ("tuned stream / in-process front CPU", "ours_stream_tuned", "inprocess_stream_tuned", "front",
     None, None),
    ("ours unary / thin gRPC front CPU", "ours_unary", "thin_unary", "front", None, None),
    ("ours stream / thin gRPC front CPU", "ours_stream", "thin_stream", "front", None, None),
    ("tuned stream / thin gRPC front CPU", "ours_stream_tuned", "thin_stream_tuned", "front", None,
     None),
    # No target: front-end CPU per engine CPU, against the thin front's. The
    # host's speed moved throughput by half between rounds of one run, and
    # CPU per token with it; this share stayed within a few percent.
    ("ours unary / thin front/engine CPU", "ours_unary", "thin_unary", "front/engine", None,
     None),
    ("ours stream / thin front/engine CPU", "ours_stream", "thin_stream", "front/engine", None,
     None),
    ("tuned stream / thin front/engine CPU", "ours_stream_tuned", "thin_stream_tuned",
     "front/engine", None, None),
    # No target: what CPU placement is worth (only with --only ...,floating).
    ("ours unary / floating tok/s", "ours_unary", "ours_floating_unary", "tok/s", None, None),
    ("ours stream / floating TTFT p50", "ours_stream", "ours_floating_stream", "ttft", None, None),
]
# fmt: on


def metric(summary: dict, name: str) -> float | None:
    if name == "tok/s":
        return summary["output_tokens_per_s"]
    if name == "front":
        return summary.get("front_cpu_s_per_1k_tokens")
    if name == "front/engine":
        return front_per_engine(summary)
    return (summary.get(name) or {}).get("p50")


def front_per_engine(summary: dict) -> float | None:
    """Front-end CPU per engine CPU (both per token): what the front end
    costs in units of the engine's own work, which a faster or slower host
    moves alike."""
    front, engine = (summary.get(f"{k}_cpu_s_per_1k_tokens") for k in ("front", "engine"))
    return front / engine if front and engine else None


def judge(value: float | None, op: str | None, target: float | None) -> dict:
    if op is None:
        return {"target": "-", "met": None}
    ok = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"target": f"{op} {target}", "met": ok}


def ratios(results: dict) -> list[dict]:
    rows = []
    for name, num, den, m, op, target in TARGETS:
        a, b = results.get(num), results.get(den)
        if not (a and b):
            continue
        value = metric(a, m) / metric(b, m) if metric(a, m) and metric(b, m) else None
        rows.append({"ratio": name, "value": value, **judge(value, op, target)})
    return rows


def table(results: dict, rows: list[dict]) -> str:
    """The final comparison, configurations first, then the ratios."""
    lines = [
        "",
        f"{'configuration':<22} {'tok/s':>9} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'TTFT p50':>9} {'errors':>6}   CPU s per 1k output tokens: front engine client"
        "   front-end ceiling tok/s   front/engine   steal %",
    ]
    for key, s in results.items():
        nan = float("nan")
        lat, ttft = s["latency"] or {}, s.get("ttft") or {}
        p50, p99 = lat.get("p50", nan) * 1000, lat.get("p99", nan) * 1000
        ttft_ms = f"{ttft['p50'] * 1000:9.1f}" if ttft else f"{'-':>9}"
        keys = ("front", "engine", "client")
        per_k = [s.get(f"{k}_cpu_s_per_1k_tokens") for k in keys]
        cpu = " ".join("-" if v is None else f"{v:.3f}" for v in per_k)
        # What one core of front end can carry at this cost per token (the
        # throughput of a host whose engine and client are elsewhere).
        ceiling = f"{1000 / per_k[0]:,.0f}" if per_k[0] else "-"
        share = front_per_engine(s)
        share = "-" if share is None else f"{share:.3f}"
        steal = s.get("steal_percent")
        steal = "-" if steal is None else f"{steal:.1f}"
        lines.append(
            f"{key:<22} {s['output_tokens_per_s']:9,.0f} {s['requests_per_s']:7.1f} "
            f"{p50:8.1f} {p99:8.1f} {ttft_ms} {sum(s['errors'].values()):>6}   {cpu:<20} "
            f"{ceiling:>9} {share:>14} {steal:>9}"
        )
    return "\n".join([*lines, "", *ratio_lines(rows)])


def ratio_lines(rows: list[dict], column: str = "value") -> list[str]:
    """Ratio rows against their targets; medians also list every round's value."""
    lines = [
        f"{'ratio':<36} {column:>7}  {'target':<8} met" + ("  rounds" if column == "median" else "")
    ]
    for r in rows:
        value = "n/a" if r["value"] is None else f"{r['value']:.3f}"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        each = ", ".join(f"{v:.2f}" for v in r.get("rounds", ()))
        lines.append(f"{r['ratio']:<36} {value:>7}  {r['target']:<8} {met:<4} {each}".rstrip())
    return lines


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per ratio: the median over rounds, with every round's value."""
    rows = []
    for name, _, _, _, op, target in TARGETS:
        per_round = [row for r in rounds for row in r if row["ratio"] == name]
        values = [row["value"] for row in per_round if row["value"] is not None]
        if not per_round:
            continue
        value = statistics.median(values) if values else None
        rows.append({"ratio": name, "value": value, **judge(value, op, target), "rounds": values})
    return rows

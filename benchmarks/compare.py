"""This service against the same engine in-process and against `vllm serve`.

One command, one run, one engine at a time (never two at once: on a 2-core
machine anything running beside an engine skews it badly):

    .venv/bin/python -m benchmarks.compare [--duration 20] [--json results.json]

On the embedded tiny-qwen2, closed loop, 64 concurrent requests of 16 random
prompt tokens and 64 output tokens (ignore_eos, temperature 0), it measures
in turn:

  (a) this service, Generate (unary)            output tok/s
  (b) this service, GenerateStream              tok/s, TTFT p50; by default
      (a delta per engine step, with text) and tuned (StreamOptions:
      --tuned-delta-tokens tokens per delta, omit_text)
  (c) the thinnest gRPC front end on the same engine (benchmarks.lib.thin_front:
      raw bytes, none of this service's code), unary, streamed and tuned:
      the ceiling for this service's own layer that is not our code
  (d) the same AsyncLLM in-process, FINAL_ONLY  tok/s; DELTA, default and
      tuned, for the streams
  (e) `vllm serve`, /v1/completions over HTTP   tok/s

and prints the ratios against their targets, and the CPU seconds per 1,000
output tokens of the server's front-end process (this service; `vllm
serve`'s API server; the in-process run's one process), of its engine
processes, and of the load client: machine-independent figures of what each
layer costs, and the front end's ceiling (the tok/s one core of it carries).
`--profile` splits this service's front-end CPU by component (py-spy; see
benchmarks.lib.profile_split). Every load runs
in a fresh process (benchmarks.lib.drive). Every configuration gets the
same CPU placement: by default (`--placement pinned`) its processes other
than vLLM's worker run on the cores the worker is not bound to, as
`rollout-service serve` places itself; `--placement floating` leaves them
where the OS puts them (`serve --no-cpu-placement`). `vllm serve` is the
exception: it runs as its users run it, since pinned its API server starves
beside its spinning engine core (`--pin-serve` pins it anyway). The load client is not
placed. Run-to-run spread on this machine is wide, so `--rounds N` measures
every configuration N times, interleaved, and the ratios are medians. Every
engine gets the same environment (ENGINE_ENV) and the same engine arguments (ENGINE_ARGS, explicit
because vLLM picks different batch defaults for its OpenAI server). The
service always returns the sampled tokens' logprobs, so by default the other
configurations compute them too (`--serve-logprobs none` drops them for
`vllm serve`).

This module is only the command line. The servers and the engine
configuration (ENGINE_ENV, ENGINE_ARGS) are in benchmarks.lib.compare_servers,
each configuration's measured run is in benchmarks.lib.compare_runs (both shared
with benchmarks.ab), and the ratios, targets and tables are in
benchmarks.lib.compare_report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.lib.compare_report import median_rows, ratio_lines, ratios, table
from benchmarks.lib.compare_runs import CONFIGS, EXTRA_CONFIGS, run_parser, run_round
from benchmarks.lib.compare_servers import ENGINE_ARGS, ENGINE_ENV, MODEL
from benchmarks.lib.loadgen import Range


def build_parser() -> argparse.ArgumentParser:
    ap = run_parser("python -m benchmarks.compare", __doc__)
    ap.add_argument(
        "--only", default=",".join(CONFIGS), help="of " + ",".join(CONFIGS + EXTRA_CONFIGS)
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rollout_service.engine.tiny_models import ensure_model

    model_dir = ensure_model(MODEL)
    only = args.only.split(",")
    rounds = []
    for n in range(1, args.rounds + 1):
        print(f"\n######## round {n} of {args.rounds}", flush=True)
        results = run_round(args, model_dir, only)
        rows = ratios(results)
        print(table(results, rows), flush=True)
        rounds.append({"results": results, "ratios": rows})
    final = median_rows([r["ratios"] for r in rounds])
    if args.rounds > 1:
        print(f"\n######## medians over {args.rounds} rounds")
        print("\n".join(ratio_lines(final, column="median")))
    if args.json:
        config = {k: str(v) if isinstance(v, (Range, Path)) else v for k, v in vars(args).items()}
        config.update(engine_env=ENGINE_ENV, engine_args=ENGINE_ARGS, model=MODEL)
        out = {"config": config, "rounds": rounds, "ratios": final}
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    errors = sum(sum(s["errors"].values()) for r in rounds for s in r["results"].values())
    missed = args.check and any(r["met"] is False for r in final)
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())

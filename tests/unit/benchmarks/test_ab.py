"""benchmarks.ab: every side measured in every round, in alternating order,
and every ratio is a side over A in the same round."""

import pytest

from benchmarks.ab import add_ratios, round_order, side_envs


def window(tok_s, ttft_p50, front, engine, client=0.1):
    return {
        "output_tokens_per_s": tok_s,
        "ttft": {"p50": ttft_p50, "p90": 2 * ttft_p50},
        "front_cpu_s_per_1k_tokens": front,
        "engine_cpu_s_per_1k_tokens": engine,
        "client_cpu_s_per_1k_tokens": client,
    }


def test_rounds_alternate_which_side_goes_first():
    assert [round_order(["A", "B", "C"], n) for n in (1, 2, 3)] == [
        ["A", "B", "C"],
        ["C", "B", "A"],
        ["A", "B", "C"],
    ]


def test_ratios_are_each_side_over_a_in_the_same_round():
    ratios = {}
    got = {
        "A": window(2000, 0.1, 0.2, 0.4),
        "B": window(1000, 0.3, 0.3, 0.4),
        "C": window(3000, 0.05, 0.2, 0.2),
    }
    add_ratios(ratios, "stream", got)
    assert ratios[("stream", "B/A", "tok/s")] == [0.5]
    assert ratios[("stream", "B/A", "TTFT p50 ms")] == pytest.approx([3.0])
    assert ratios[("stream", "B/A", "front/engine")] == pytest.approx([1.5])
    assert ratios[("stream", "C/A", "tok/s")] == [1.5]
    assert ratios[("stream", "C/A", "front/engine")] == pytest.approx([2.0])
    assert not [k for k in ratios if k[1] == "A/A"]


def test_a_figure_one_side_lacks_gives_no_ratio():
    ratios = {}
    unary = window(4000, 0, 0.1, 0.4)
    unary.pop("ttft")  # unary loads have no TTFT
    add_ratios(ratios, "unary", {"A": unary, "B": dict(unary)})
    assert ("unary", "B/A", "TTFT p50 ms") not in ratios
    assert ratios[("unary", "B/A", "tok/s")] == [1.0]


def test_env_flags_go_to_their_side_and_bad_ones_are_refused():
    envs = side_envs(["B:X=1", "B:PYTHONPATH=/x=y"], ["A", "B"])
    assert envs == {"A": {}, "B": {"X": "1", "PYTHONPATH": "/x=y"}}
    for bad in ("C:X=1", "B:=1", "B:X", "X=1"):
        with pytest.raises(SystemExit, match="LABEL:NAME=VALUE"):
            side_envs([bad], ["A", "B"])


def test_a_load_side_a_does_not_run_gives_no_ratios():
    ratios = {}
    add_ratios(
        ratios, "stream", {"B": window(1000, 0.1, 0.2, 0.4), "C": window(900, 0.1, 0.2, 0.4)}
    )
    assert ratios == {}


def test_vllm_serve_runs_unary_loads_only():
    from benchmarks.ab import Side

    serve = Side.__new__(Side)
    serve.kind = "serve"
    assert serve.runs("unary") and not serve.runs("stream") and not serve.runs("many")
    serve.label, serve.server = "D", type("VllmServe", (), {"base": "http://127.0.0.1:8000"})()
    assert serve.describe() == "D: serve on http://127.0.0.1:8000"
    ours = Side.__new__(Side)
    ours.kind = "ours"
    assert all(ours.runs(load) for load in ("unary", "stream", "tuned", "many"))

"""benchmarks.ab: both sides measured in every round, in alternating order,
and every ratio is B over A of the same round."""

import pytest

from benchmarks.ab import add_ratios, env_pairs, round_order


def window(tok_s, ttft_p50, front, engine, client=0.1):
    return {
        "output_tokens_per_s": tok_s,
        "ttft": {"p50": ttft_p50, "p90": 2 * ttft_p50},
        "front_cpu_s_per_1k_tokens": front,
        "engine_cpu_s_per_1k_tokens": engine,
        "client_cpu_s_per_1k_tokens": client,
    }


def test_rounds_alternate_which_side_goes_first():
    assert [round_order(["A", "B"], n) for n in (1, 2, 3, 4)] == [
        ["A", "B"],
        ["B", "A"],
        ["A", "B"],
        ["B", "A"],
    ]


def test_ratios_are_b_over_a_per_round_and_skip_missing_figures():
    ratios = {}
    add_ratios(ratios, "stream", window(2000, 0.1, 0.2, 0.4), window(1000, 0.3, 0.3, 0.4))
    unary = window(4000, 0, 0.1, 0.4)
    unary.pop("ttft")  # unary loads have no TTFT
    add_ratios(ratios, "unary", unary, unary)
    assert ratios[("stream", "tok/s")] == [0.5]
    assert ratios[("stream", "TTFT p50 ms")] == pytest.approx([3.0])
    assert ratios[("stream", "front/engine")] == pytest.approx([1.5])
    assert ("unary", "TTFT p50 ms") not in ratios
    assert ratios[("unary", "tok/s")] == [1.0]


def test_env_pairs_parse_and_refuse_a_pair_without_a_name():
    assert env_pairs(["A=1", "PYTHONPATH=/x=y"]) == {"A": "1", "PYTHONPATH": "/x=y"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        env_pairs(["=1"])
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        env_pairs(["A"])

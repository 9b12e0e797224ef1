"""Pure helpers of benchmarks/zero.py (no TensorFlow, no clusters)."""

import pytest
from benchmark_loader import load_benchmark

zero = load_benchmark("zero")


def test_pairs_alternate_which_variant_runs_first():
    assert zero.pair_orders(3) == [("sharded", "unsharded"), ("unsharded", "sharded"),
                                   ("sharded", "unsharded")]


def test_a_ratio_is_the_median_of_each_pairs_own_ratio():
    pairs = [{"sharded": 1.0, "unsharded": 2.0}, {"sharded": 3.0, "unsharded": 3.0},
             {"sharded": 9.0, "unsharded": 3.0}]
    assert zero.pair_ratio(pairs) == 1.0


def test_the_memory_ratio_is_the_largest_over_devices():
    assert zero.memory_ratio({"a": 30, "b": 26}, {"a": 100, "b": 100}) == 0.3
    with pytest.raises(ValueError, match="devices differ"):
        zero.memory_ratio({"a": 1}, {"b": 1})


def test_arguments_are_checked():
    assert zero.parse_args([]).pairs == 3
    with pytest.raises(SystemExit):
        zero.parse_args(["--steps", "1"])
    with pytest.raises(SystemExit):
        zero.parse_args(["--rounds", "0"])


def test_a_wire_round_the_sampler_misread_is_dropped(capsys):
    weights = 1_000  # float32 gradients: a floor of 2,000 B per step
    zero.report_wire([{"sharded": 7.0, "unsharded": 4_400.0},
                      {"sharded": 4_410.0, "unsharded": 4_400.0}], weights)
    out = capsys.readouterr().out
    assert "round dropped: the sampler read 7 B per step" in out
    assert out.strip().endswith(f"wire_bytes_ratio={4_410 / 4_400:.4f}")


def test_no_plausible_wire_round_prints_no_ratio(capsys):
    zero.report_wire([{"sharded": 7.0, "unsharded": 21.0}], 1_000)
    assert "wire_bytes_ratio=" not in capsys.readouterr().out

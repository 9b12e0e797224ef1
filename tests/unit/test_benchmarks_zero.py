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

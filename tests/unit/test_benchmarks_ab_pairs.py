"""The interleaved A/B pairs shared by the benchmarks (benchmarks/ab_pairs.py)."""

import pytest
from benchmark_loader import load_benchmark

ab_pairs = load_benchmark("ab_pairs")


def test_pair_orders_alternate_which_variant_goes_first():
    assert ab_pairs.pair_orders(3) == [
        ("hybridpar", "raw"),
        ("raw", "hybridpar"),
        ("hybridpar", "raw"),
    ]


def test_summarize_takes_the_median_of_each_variant_then_the_ratio():
    pairs = [
        {"hybridpar": 1.0, "raw": 2.0},
        {"hybridpar": 3.0, "raw": 1.0},
        {"hybridpar": 2.2, "raw": 2.0},
    ]
    assert ab_pairs.summarize(pairs) == pytest.approx((2.2, 2.0, 1.1))

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


def test_parse_child_output_takes_the_last_json_line():
    stdout = 'noise\n{"median_step_s": 1.0}\nmore noise\n{"median_step_s": 0.5, "steps": 3}\n'
    assert ab_pairs.parse_child_output(stdout) == {"median_step_s": 0.5, "steps": 3}


def test_parse_child_output_without_json_names_what_it_got():
    with pytest.raises(ValueError, match="no JSON result line.*nothing here"):
        ab_pairs.parse_child_output("nothing here\n")

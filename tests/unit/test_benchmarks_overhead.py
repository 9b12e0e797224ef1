"""Pure helpers of benchmarks/overhead.py (no TensorFlow, no child processes)."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "overhead.py"
_spec = importlib.util.spec_from_file_location("benchmarks_overhead", _PATH)
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


def test_pair_orders_alternate_which_variant_goes_first():
    assert overhead.pair_orders(3) == [
        ("hybridpar", "raw"),
        ("raw", "hybridpar"),
        ("hybridpar", "raw"),
    ]


def test_parse_child_output_takes_the_last_json_line():
    stdout = 'noise\n{"median_step_s": 1.0}\nmore noise\n{"median_step_s": 0.5, "steps": 3}\n'
    assert overhead.parse_child_output(stdout) == {"median_step_s": 0.5, "steps": 3}


def test_parse_child_output_without_json_names_what_it_got():
    with pytest.raises(ValueError, match="no JSON result line.*nothing here"):
        overhead.parse_child_output("nothing here\n")


def test_summarize_takes_the_median_of_each_variant_then_the_ratio():
    pairs = [
        {"hybridpar": 1.0, "raw": 2.0},
        {"hybridpar": 3.0, "raw": 1.0},
        {"hybridpar": 2.2, "raw": 2.0},
    ]
    assert overhead.summarize(pairs) == pytest.approx((2.2, 2.0, 1.1))


def test_parse_args_refuses_a_batch_that_does_not_split_over_the_devices():
    with pytest.raises(SystemExit):
        overhead.parse_args(["--batch", "255"])
    assert overhead.parse_args([]).pairs == 5

"""Pure helpers of benchmarks/overhead.py (no TensorFlow, no child processes)."""


import pytest
from benchmark_loader import load_benchmark

overhead = load_benchmark("overhead")


def test_parse_child_output_takes_the_last_json_line():
    stdout = 'noise\n{"median_step_s": 1.0}\nmore noise\n{"median_step_s": 0.5, "steps": 3}\n'
    assert overhead.parse_child_output(stdout) == {"median_step_s": 0.5, "steps": 3}


def test_parse_child_output_without_json_names_what_it_got():
    with pytest.raises(ValueError, match="no JSON result line.*nothing here"):
        overhead.parse_child_output("nothing here\n")


def test_parse_args_refuses_a_batch_that_does_not_split_over_the_devices():
    with pytest.raises(SystemExit):
        overhead.parse_args(["--batch", "255"])
    assert overhead.parse_args([]).pairs == 5

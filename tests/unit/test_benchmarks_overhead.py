"""Pure helpers of benchmarks/overhead.py (no TensorFlow, no child processes)."""


import pytest
from benchmark_loader import load_benchmark

overhead = load_benchmark("overhead")


def test_parse_args_refuses_a_batch_that_does_not_split_over_the_devices():
    with pytest.raises(SystemExit):
        overhead.parse_args(["--batch", "255"])
    assert overhead.parse_args([]).pairs == 5


def test_parse_args_takes_steps_per_execution():
    assert overhead.parse_args(["--steps_per_execution", "8"]).steps_per_execution == 8
    assert overhead.parse_args([]).steps_per_execution == 1
    with pytest.raises(SystemExit):
        overhead.parse_args(["--steps_per_execution", "0"])

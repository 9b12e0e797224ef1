"""Pure helpers of benchmarks/overhead.py (no TensorFlow, no child processes)."""


import pytest
from benchmark_loader import load_benchmark

overhead = load_benchmark("overhead")


def test_parse_args_refuses_a_batch_that_does_not_split_over_the_devices():
    with pytest.raises(SystemExit):
        overhead.parse_args(["--batch", "255"])
    assert overhead.parse_args([]).pairs == 5

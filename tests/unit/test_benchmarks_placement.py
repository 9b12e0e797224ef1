"""Pure helpers of benchmarks/placement.py (no TensorFlow, no child processes)."""

import pytest
from benchmark_loader import load_benchmark

placement = load_benchmark("placement")


def test_memory_ratio_compares_the_fullest_devices():
    per_device = {
        "1x4": {"a": 110, "b": 100, "c": 100, "d": 90},
        "4x1": {"a": 400, "b": 400, "c": 400, "d": 400},
    }
    assert placement.memory_ratio(per_device) == pytest.approx(110 / 400)


@pytest.mark.parametrize("argv", [["--batch", "126"], ["--dim", "30"], ["--pairs", "0"]])
def test_parse_args_refuses_sizes_that_do_not_fit(argv):
    with pytest.raises(SystemExit):
        placement.parse_args(argv)

"""Pure helpers of benchmarks/step_profile.py (no TensorFlow)."""

import cProfile
import pstats

import pytest
from benchmark_loader import load_benchmark

step_profile = load_benchmark("step_profile")


def test_per_step_counts_read_calls_from_a_profile():
    def leaf() -> int:
        return 1

    def step() -> int:
        return leaf() + leaf()

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(4):
        step()
    profiler.disable()
    counts = step_profile.per_step_counts(pstats.Stats(profiler), steps=4)
    assert counts["python_calls"] >= 3  # step and two leaves per step
    assert counts["eager_ops"] == 0 and counts["graph_runs"] == 0


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--top", "0"]])
def test_parse_args_refuses_non_positive_sizes(argv):
    with pytest.raises(SystemExit):
        step_profile.parse_args(argv)

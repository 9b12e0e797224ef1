"""Pure helpers of benchmarks/partition.py (no TensorFlow, no profiling)."""

import random

import pytest
from benchmark_loader import load_benchmark

partition = load_benchmark("partition")


def test_bottleneck_is_the_slowest_stage():
    assert partition.bottleneck([1, 2, 3, 4], (0, 0, 1, 1)) == 7


def test_exhaustive_search_finds_the_best_cut():
    assert partition.exhaustive_bottleneck([1, 1, 1, 1, 4], 2) == 4
    assert partition.exhaustive_bottleneck([5, 1, 1, 1], 4) == 5


@pytest.mark.parametrize("seed", range(5))
def test_hybridpars_cut_equals_the_exhaustive_optimum(seed):
    rng = random.Random(seed)
    times = [rng.uniform(0.1, 5) for _ in range(12)]
    for stages in (2, 4):
        assert partition.bottleneck(times, partition.cut(times, stages)) == pytest.approx(
            partition.exhaustive_bottleneck(times, stages))


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--repeats", "0"]])
def test_parse_args_refuses_sizes_that_do_not_fit(argv):
    with pytest.raises(SystemExit):
        partition.parse_args(argv)

"""Pure helpers of benchmarks/xla.py (no TensorFlow, no child processes)."""

import pytest
from benchmark_loader import load_benchmark

xla = load_benchmark("xla")


def test_pairs_alternate_which_variant_runs_first():
    assert xla.pair_orders(3) == [(True, False), (False, True), (True, False)]


def test_ratio_is_median_with_xla_over_median_without():
    pairs = [{True: 0.030, False: 0.010}, {True: 0.020, False: 0.020}, {True: 0.025, False: 0.015}]
    assert xla.ratio(pairs) == pytest.approx(0.025 / 0.015)


@pytest.mark.parametrize("argv", [["--pairs", "0"], ["--batch", "255"], ["--examples", "8"]])
def test_parse_args_refuses_bad_sizes(argv):
    with pytest.raises(SystemExit):
        xla.parse_args(argv)

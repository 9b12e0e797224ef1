"""Pure helpers of benchmarks/patch_overhead.py (no TensorFlow, no child processes)."""

import pytest
from benchmark_loader import load_benchmark

patch_overhead = load_benchmark("patch_overhead")


def test_parse_args_defaults_and_refusals():
    args = patch_overhead.parse_args([])
    assert (args.pairs, args.stages, args.child) == (5, 1, None)
    with pytest.raises(SystemExit):
        patch_overhead.parse_args(["--calls", "0"])
    with pytest.raises(SystemExit):
        patch_overhead.parse_args(["--stages", "3"])

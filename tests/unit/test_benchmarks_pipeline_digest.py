"""Pure helpers of benchmarks/pipeline_digest.py (no digest taken)."""

import pytest
from benchmark_loader import load_benchmark

pipeline_digest = load_benchmark("pipeline_digest")


def test_parse_args_defaults_and_refusals():
    args = pipeline_digest.parse_args([])
    assert (args.gigabytes, args.files, args.repeats) == (2.2, 64, 5)
    for wrong in (["--gigabytes", "0"], ["--files", "0"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            pipeline_digest.parse_args(wrong)


def test_rows_make_the_gigabytes_asked_for():
    assert pipeline_digest.rows_for(2.2) * pipeline_digest.FEATURES * 4 == pytest.approx(
        2.2e9, rel=1e-6)
    assert pipeline_digest.rows_for(1e-12) == 1

"""Pure helpers of benchmarks/resume.py (no TensorFlow, no training)."""

import json

import pytest
from benchmark_loader import load_benchmark

bench = load_benchmark("resume")


def test_the_report_ends_with_the_three_ratios():
    seconds = {"replay": {"100": [1.0, 2.0, 1.5], "10000": [6.0, 6.0, 9.0]},
               "restore": {"100": [1.0, 1.2, 1.1], "10000": [1.1, 1.3, 1.2]}}
    lines = bench.summary(seconds, {"replay": [0.004, 0.005], "restore": [0.0045, 0.0045]})
    assert lines[-3:] == ["input_step_time_ratio=1.000", "replay_resume_step_cost_ratio=4.000",
                          "resume_step_cost_ratio=1.091"]
    assert lines[0].startswith("step time, steps 100 to 2100: 4.50 ms with the saved iterator, "
                               "4.50 ms with TensorFlow's distributed iterator (runs 4.50 4.50")
    assert lines[1].startswith("replay: fit start to the first trained step, 1.50 s at step "
                               "100, 6.00 s at step 10000 (runs step 100: 1.00 2.00 1.50")


def test_the_seconds_are_read_from_the_childs_line():
    output = f"noise\n{bench.RESULT_PREFIX}{json.dumps({'seconds': 2.5})}\n"
    assert bench.parse_result(output) == 2.5
    with pytest.raises(ValueError, match="printed no RESUME_BENCH line"):
        bench.parse_result("Epoch 1/1\n")


def test_the_epoch_must_outlast_the_deepest_resume():
    assert bench.parse_args([]).epoch_steps == 20_000
    with pytest.raises(SystemExit):
        bench.parse_args(["--epoch_steps", "10000"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])

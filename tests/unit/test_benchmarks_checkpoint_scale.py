"""Pure helpers of benchmarks/checkpoint_scale.py (no TensorFlow, no cluster)."""

import json

import pytest
from benchmark_loader import load_benchmark

bench = load_benchmark("checkpoint_scale")


def result() -> dict:
    return {"rows": 1000, "dim": 10, "table_bytes": 40_000,
            "save": [2.0, 4.0, 3.0], "bare_save": [2.0, 2.0], "restore": [1.0],
            "bare_restore": [2.0],
            "save_memory": 10_000, "bare_save_memory": 0, "restore_memory": 4_000,
            "bare_restore_memory": 0, "resume": {"100": 2.0, "10000": 3.0}}


def test_the_report_ends_with_the_four_ratios():
    lines = bench.summary(result())
    assert lines[-4:] == ["chief_save_memory_ratio=0.250", "chief_restore_memory_ratio=0.100",
                          "save_time_ratio=1.500", "resume_step_cost_ratio=1.500"]
    assert lines[2].startswith("restore: hybridpar 1.00 s, bare tf.train.Checkpoint 2.00 s "
                               "(ratio 0.50; runs 1.00-1.00 s and 2.00-2.00 s)")
    assert "runs 2.00-4.00 s and 2.00-2.00 s" in lines[1]


def test_the_chiefs_line_is_found_in_the_launcher_output():
    output = f"[ps:0] noise\n[chief:0] {bench.RESULT_PREFIX}{json.dumps({'rows': 3})}\n"
    assert bench.parse_result(output) == {"rows": 3}
    with pytest.raises(ValueError, match="printed no SCALE_BENCH line"):
        bench.parse_result("[chief:0] Epoch 1/1\n")


def test_sizes_must_be_positive_and_default_to_a_gigabyte_table():
    args = bench.parse_args([])
    assert args.rows * args.dim * 4 == 1_073_741_824
    with pytest.raises(SystemExit):
        bench.parse_args(["--rows", "0"])
    with pytest.raises(ValueError, match="denominator must be positive. Received: 0"):
        bench.ratio(1.0, 0.0)


def test_hybridpar_and_the_bare_checkpoint_take_turns_at_going_first():
    assert bench.call_order(0) == ["bare_save", "save", "bare_restore", "restore"]
    assert bench.call_order(1) == ["save", "bare_save", "restore", "bare_restore"]

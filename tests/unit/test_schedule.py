"""Pipeline schedule helpers: the GPipe bound and profiled timelines (pure Python)."""

import json

import pytest

from hybridpar.parallel.schedule import (
    Interval,
    bubble_fraction,
    chrome_trace,
    classify_op,
    gpipe_speedup_bound,
    intervals_from_ops,
    save_timeline_png,
)


def test_gpipe_bound_and_bubble():
    assert gpipe_speedup_bound(1, 2) == 1.0
    assert gpipe_speedup_bound(4, 2) == pytest.approx(1.6)
    assert gpipe_speedup_bound(8, 4) == pytest.approx(32 / 11)
    assert bubble_fraction(4, 2) == pytest.approx(0.2)
    assert bubble_fraction(1, 4) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "name, op_type, expected",
    [
        ("StatefulPartitionedCall/microbatch2/functional_1/hybridpar_stage1/d/MatMul",
         "MatMul", (2, 1, "forward")),
        ("StatefulPartitionedCall/gradient_tape/microbatch0/functional_1/hybridpar_stage0/d/"
         "MatMul/MatMul", "_MklMatMul", (0, 0, "backward")),
        ("StatefulPartitionedCall/replica_1/microbatch0/functional_1/hybridpar_stage0/d/MatMul",
         "MatMul", None),
        ("StatefulPartitionedCall/microbatch0/compile_loss/mse/Mean", "Mean", None),
        ("StatefulPartitionedCall/functional_1/hybridpar_stage1/d/MatMul", "MatMul",
         (0, 1, "forward")),
        ("gradient_tape/microbatch3_1/functional_1/hybridpar_stage1_2/d/MatMul/MatMul_1",
         "_MklMatMul", (3, 1, "backward")),
        ("StatefulPartitionedCall/microbatch0/hybridpar_stage1/d/BiasAdd/ReadVariableOp",
         "ReadVariableOp", None),
    ],
)
def test_ops_are_attributed_by_their_name_scopes(name, op_type, expected):
    assert classify_op(name, op_type) == expected


def test_intervals_span_each_microbatch_stage_and_phase_within_a_step():
    stage_1 = "microbatch0/hybridpar_stage1/d/MatMul"
    ops = [
        ("hybridpar_step_1", "", 100, 900),
        (stage_1, "MatMul", 200, 300),
        (stage_1 + "_1", "MatMul", 250, 400),
        ("gradient_tape/" + stage_1, "MatMul", 500, 600),
        (stage_1, "MatMul", 1000, 1100),  # outside every recorded step
    ]
    intervals = intervals_from_ops(ops, {1: (100, 900)})
    assert intervals == [
        Interval(1, 0, 1, "backward", 500e-9, 600e-9),
        Interval(1, 0, 1, "forward", 200e-9, 400e-9),
    ]


def test_chrome_trace_has_a_row_per_stage_and_a_slice_per_interval(tmp_path):
    intervals = [Interval(1, 0, 0, "forward", 1.0, 1.002), Interval(1, 0, 1, "forward", 1.002,
                                                                      1.005)]
    trace = chrome_trace(intervals, ["/device:CPU:0", "/device:CPU:1"])
    json.dumps(trace)
    rows = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [r["args"]["name"] for r in rows] == ["stage 0 (/device:CPU:0)",
                                                  "stage 1 (/device:CPU:1)"]
    assert [(s["tid"], s["name"], round(s["ts"]), round(s["dur"])) for s in slices] == [
        (0, "F0", 0, 2000), (1, "F0", 2000, 3000)]
    save_timeline_png(intervals, ["/device:CPU:0", "/device:CPU:1"], tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"

"""Pipeline schedule helpers: the GPipe bound and profiled timelines (pure Python)."""

import json

import pytest

from hybridpar.parallel.schedule import (
    Interval,
    activations_in_flight,
    bubble_fraction,
    chrome_trace,
    classify_op,
    forward_waits_for,
    gpipe_speedup_bound,
    intervals_from_ops,
    one_f_one_b_order,
    save_timeline_png,
    scheduled_step_seconds,
    stage_seconds_per_microbatch,
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


@pytest.mark.parametrize("microbatches, stages", [(1, 2), (2, 2), (4, 2), (8, 2), (3, 4), (8, 4)])
def test_one_f_one_b_order_runs_each_phase_once_and_bounds_activations(microbatches, stages):
    orders = one_f_one_b_order(microbatches, stages)
    assert len(orders) == stages
    for stage, order in enumerate(orders):
        expected = {(p, m) for p in "FB" for m in range(microbatches)}
        assert sorted(order) == sorted(expected)
        assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(microbatches))
        assert activations_in_flight(order) == min(stages - stage, microbatches)
        for m in range(microbatches):  # the waits the step builds agree with the order
            waited = forward_waits_for(m, stage, stages)
            if waited is not None:
                assert order.index(("B", waited)) < order.index(("F", m))


def test_one_f_one_b_order_on_two_stages():
    assert one_f_one_b_order(4, 2) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)],
    ]
    assert [forward_waits_for(m, 0, 2) for m in range(4)] == [None, None, 0, 1]
    assert [forward_waits_for(m, 1, 2) for m in range(4)] == [None, 0, 1, 2]


def test_gpipe_order_holds_every_microbatch():
    gpipe = [("F", m) for m in range(8)] + [("B", m) for m in range(8)]
    assert activations_in_flight(gpipe) == 8


def test_stage_seconds_per_microbatch_counts_ops_of_each_stage_and_deferred_products():
    ms = 1_000_000
    ops = [
        ("microbatch0/functional/hybridpar_stage0/d/MatMul", "MatMul", 0, 2 * ms),
        ("gradient_tape/microbatch0/functional/hybridpar_stage0/d/MatMul", "MatMul", 0, 4 * ms),
        ("microbatch1/functional/hybridpar_stage1/d/MatMul", "MatMul", 0, 6 * ms),
        ("weight_gradients_stage1/MatMul", "_MklMatMul", 0, 2 * ms),
        ("weight_gradients_stage1/ReadVariableOp", "ReadVariableOp", 0, 9 * ms),
        ("replica_1/weight_gradients_stage0/MatMul", "MatMul", 0, 9 * ms),
        ("microbatch0/compile_loss/mse/Mean", "Mean", 0, 9 * ms),
    ]
    per = stage_seconds_per_microbatch(ops, steps=1, microbatches=2)
    assert per == pytest.approx({0: 0.003, 1: 0.004})
    assert scheduled_step_seconds(4, 2, 0.004) == pytest.approx(0.02)

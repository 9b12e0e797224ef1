"""Pure helpers of benchmarks/pipeline.py (no TensorFlow, no training)."""

import pytest
from benchmark_loader import load_benchmark

pipeline = load_benchmark("pipeline")


def test_speedups_compare_each_m_with_m1_and_the_gpipe_bound():
    result = pipeline.speedups({1: 0.100, 2: 0.080, 4: 0.0625})
    measured, bound, ratio = result[4]
    assert measured == pytest.approx(1.6)
    assert bound == pytest.approx(1.6)
    assert ratio == pytest.approx(1.0)
    assert result[2][0] == pytest.approx(1.25) and result[2][2] == pytest.approx(1.25 / (4 / 3))


@pytest.mark.parametrize("argv", [["--batch", "100"], ["--rounds", "0"], ["--units", "0"]])
def test_parse_args_refuses_sizes_that_do_not_split(argv):
    with pytest.raises(SystemExit):
        pipeline.parse_args(argv)


def test_matmul_phases_split_forward_and_backward_per_step():
    ops = [
        ("a/microbatch0/hybridpar_stage0/dense/Relu", "_MklNativeFusedMatMul", 0, 4_000_000),
        ("a/gradient_tape/microbatch0/hybridpar_stage0/dense/MatMul", "_MklMatMul", 0, 2_000_000),
        ("a/weight_gradients/MatMul", "MatMul", 0, 6_000_000),
        ("a/gradient_tape/microbatch0/hybridpar_stage0/dense/BiasAddGrad", "BiasAddGrad", 0, 9),
    ]
    phases = pipeline.matmul_phases(ops, steps=2)
    assert phases == {"forward": pytest.approx(0.002), "backward": pytest.approx(0.004)}


def test_schedule_efficiency_is_the_allowed_step_over_the_measured_one():
    # M=4, K=2: 5 slots of the slowest stage's 10 ms allow 50 ms; 62.5 ms measured
    assert pipeline.schedule_efficiency(4, {0: 0.008, 1: 0.010}, 0.0625) == pytest.approx(0.8)


def test_variants_compare_the_schedules_at_m4_and_m8():
    assert set(pipeline.VARIANTS) >= {(4, "gpipe"), (4, "1f1b"), (8, "gpipe"), (8, "1f1b")}
    assert (1, "1f1b") not in pipeline.VARIANTS  # 1F1B needs microbatches > 1

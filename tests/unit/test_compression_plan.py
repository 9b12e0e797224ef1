"""What gradient compression sends per gradient, and the bytes per step (pure Python)."""

import pytest

from hybridpar.parallel.compression_plan import (
    GradientSpec,
    matrix_shape,
    plan,
    powersgd_applies,
)

KERNEL = GradientSpec("hidden/kernel", (64, 128), 4, floating=True)
BIAS = GradientSpec("hidden/bias", (128,), 4, floating=True)
HEAD = GradientSpec("logits/kernel", (128, 10), 4, floating=True)
STEPS = GradientSpec("counter", (4, 4), 8, floating=False)
EMBEDDING = GradientSpec("embedding", (1000, 16), 4, floating=True, sparse=True)
HALF = GradientSpec("half/kernel", (64, 64), 2, floating=False)


def test_a_gradient_is_seen_as_a_matrix_over_its_last_dimension():
    assert matrix_shape((64, 128)) == (64, 128)
    assert matrix_shape((3, 3, 16, 32)) == (144, 32)  # a Conv2D kernel: kh*kw*cin x cout
    assert matrix_shape((16, 2, 8)) == (32, 8)


@pytest.mark.parametrize("spec, rank, min_elements, applies", [
    (KERNEL, 4, 4096, True),           # 4 * (64 + 128) = 768 < 8192
    (HEAD, 4, 4096, False),            # 1280 elements < min_elements
    (HEAD, 4, 0, True),                # 4 * 138 = 552 < 1280
    (HEAD, 10, 0, False),              # 10 * 138 = 1380 >= 1280: nothing saved
    (BIAS, 1, 0, False),               # a vector
    (STEPS, 1, 0, False),              # not floating
    (EMBEDDING, 4, 0, False),          # sparse
])
def test_which_gradients_powersgd_compresses(spec, rank, min_elements, applies):
    assert powersgd_applies(spec, rank, min_elements) is applies


def test_fp16_halves_every_floating_gradient_and_passes_the_rest():
    report = plan([KERNEL, BIAS, HALF, STEPS], "fp16")
    assert [t.method for t in report.treatments] == ["cast", "cast", "uncompressed",
                                                    "uncompressed"]
    assert report.bytes_before == 8192 * 4 + 128 * 4 + 4096 * 2 + 16 * 8
    assert report.bytes_after == 8192 * 2 + 128 * 2 + 4096 * 2 + 16 * 8
    assert report.summary() == (
        "gradient compression fp16: 2 floating gradient(s) of 33,280 B sent as float16, "
        "2 uncompressed (8,320 B); 41,600 B -> 24,960 B per step and replica (ratio 0.6000)")


def test_powersgd_sends_the_factors_and_the_rest_exactly():
    report = plan([KERNEL, BIAS, HEAD, EMBEDDING], "powersgd", rank=2, min_elements=4096)
    assert [t.method for t in report.treatments] == ["powersgd", "uncompressed",
                                                    "uncompressed", "uncompressed"]
    assert report.treatments[0].wire_bytes == 2 * (64 + 128) * 4
    assert report.bytes_before == (8192 + 128 + 1280) * 4  # the sparse gradient is uncounted
    assert report.bytes_after == (384 + 128 + 1280) * 4
    assert report.ratio == pytest.approx(1792 / 9600)
    assert report.summary() == (
        "gradient compression powersgd (rank 2): 1 gradient(s) of 32,768 B via PowerSGD, "
        "2 uncompressed (5,632 B), 1 sparse (uncounted); 38,400 B -> 7,168 B per step and "
        "replica (ratio 0.1867)")


def test_nothing_to_send_has_ratio_one():
    assert plan([], "bf16").ratio == 1.0

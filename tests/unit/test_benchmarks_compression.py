"""Pure helpers of benchmarks/compression.py (no TensorFlow, no clusters)."""

import pytest
from benchmark_loader import load_benchmark

compression = load_benchmark("compression")


def record(step: float, wire: float, accuracy: float = 0.9, analytic: float = 1.0) -> dict:
    return {"median_step_s": step, "wire_bytes": wire, "steps": 10, "accuracy": accuracy,
            "analytic_ratio": analytic}


def test_a_variant_names_its_communication_section():
    assert compression.communication("none") == {"compression": "none"}
    assert compression.communication("bf16") == {"compression": "bf16"}
    assert compression.communication("powersgd-16") == {"compression": "powersgd",
                                                        "powersgd": {"rank": 16}}


def test_rounds_rotate_the_order():
    assert compression.round_orders(["a", "b", "c"], 4) == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


@pytest.mark.parametrize("text, bits", [("1gbit", 10**9), ("500mbit", 5 * 10**8),
                                        ("100kbit", 10**5), ("2.5Gbit", 25 * 10**8)])
def test_bandwidth_reads_tc_rates(text, bits):
    assert compression.bandwidth_bits(text) == bits


def test_bandwidth_refuses_other_text():
    with pytest.raises(ValueError, match="--bandwidth must be a tc rate like 1gbit"):
        compression.bandwidth_bits("1GB/s")


def test_the_token_bucket_holds_10_ms_and_at_least_32_kb():
    assert compression.tbf_burst(10**9) == 1_250_000
    assert compression.tbf_burst(10**6) == 32 * 1024


def test_summary_compares_each_round_with_its_own_uncompressed_run():
    rounds = [
        {"none": [record(0.2, 1000), record(0.1, 1000)],
         "fp16": [record(0.1, 500, 0.9, 0.5), record(0.05, 500)]},
        {"none": [record(0.4, 1000), record(0.3, 1000)],
         "fp16": [record(0.1, 520, 0.9, 0.5), record(0.1, 520)]},
    ]
    table = compression.summarize(rounds)
    assert table["none"]["step_ratio"] == 1.0 and table["none"]["bytes_ratio"] == 1.0
    assert table["fp16"]["step_ratio"] == pytest.approx((0.5 + 0.25) / 2)
    assert table["fp16"]["bytes_ratio"] == pytest.approx(0.51)
    assert table["fp16"]["bytes_per_step"] == pytest.approx(102)  # both workers, per step
    assert table["fp16"]["analytic"] == 0.5
    assert table["fp16"]["accuracy_delta"] == 0.0 and table["fp16"]["accuracy_stable"]


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        compression.parse_args(["--variants", "fp16"])  # no uncompressed reference
    with pytest.raises(SystemExit):
        compression.parse_args(["--epochs", "1"])
    args = compression.parse_args(["--variants", "none,powersgd-4", "--network", "netns"])
    assert args.variants == ("none", "powersgd-4") and args.bandwidth == "1gbit"

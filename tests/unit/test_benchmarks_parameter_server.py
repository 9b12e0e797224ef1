"""Pure helpers of benchmarks/parameter_server.py (no TensorFlow, no clusters)."""

import pytest
from benchmark_loader import load_benchmark

ps = load_benchmark("parameter_server")


def test_variable_bytes_counts_kernels_and_biases_in_float32():
    assert ps.variable_bytes(64, 512, 2) == 4 * (64 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
    assert ps.variable_bytes(3, 4, 1, classes=2) == 4 * (3 * 4 + 4 + 4 * 2 + 2)


def test_push_pull_volume_is_two_s_per_worker_step():
    assert ps.push_pull_volume(1, 1000) == 2000
    assert ps.push_pull_volume(2, 1000) == 4000


def test_gathered_volume_moves_dense_variables_and_looked_up_rows_both_ways():
    assert ps.gathered_volume(dense=1000, row_bytes=64, batch=10) == 2 * (1000 + 640)


def test_pairs_alternate_which_cluster_runs_first():
    assert ps.pair_orders(3) == [("hybridpar", "raw"), ("raw", "hybridpar"), ("hybridpar", "raw")]


def test_fit_vs_raw_is_the_ratio_of_median_rates():
    rates = [{"hybridpar": 95.0, "raw": 100.0}, {"hybridpar": 90.0, "raw": 80.0},
             {"hybridpar": 110.0, "raw": 120.0}]
    assert ps.fit_vs_raw(rates) == (95.0, 100.0, pytest.approx(0.95))


def test_cluster_ports_are_every_task_port():
    tf_config = {"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "h:3"],
                             "ps": ["[::1]:4"]}, "task": {"type": "chief", "index": 0}}
    assert ps.cluster_ports(tf_config) == [1, 2, 3, 4]


@pytest.mark.parametrize("argv, match", [
    (["--pairs", "0"], "--pairs must be >= 1. Received: 0."),
    (["--steps", "0"], "--steps must be >= 1. Received: 0."),
])
def test_bad_sizes_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit):
        ps.parse_args(argv)
    assert match in capsys.readouterr().err

"""Pure helpers of benchmarks/multiworker.py (no TensorFlow, no clusters)."""

from types import SimpleNamespace

import pytest
from benchmark_loader import load_benchmark

multiworker = load_benchmark("multiworker")

PROC_NET_DEV = """\
Inter-|   Receive                                   |  Transmit
 face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop ...
    lo: 52157315 71739 0 0 0 0 0 0 52157316 71740 0 0 0 0 0 0
  eth0: 276065519 7506 0 0 0 0 0 0 421915 3861 0 0 0 0 0 0
"""

SS = """\
ESTAB 0      0      127.0.0.1:52356    127.0.0.1:33285
\t bbr rto:204 mss:47616 bytes_sent:100000 bytes_retrans:65536 bytes_acked:100001
ESTAB 0      0      192.0.2.2:35910 203.0.113.80:443
\t bbr wscale:10,10 rto:204 bytes_sent:50608 bytes_acked:50609 bytes_received:29429096
ESTAB 0      0      127.0.0.1:33285    127.0.0.1:52356
\t bbr wscale:10,10 rto:208 cwnd:10 bytes_received:100000 segs_out:2 segs_in:5
"""


def test_ring_volume_is_what_all_workers_send_together():
    assert multiworker.ring_volume(2, 1000) == 2000  # each of 2 workers sends S
    assert multiworker.ring_volume(4, 1000) == 6000  # each of 4 sends 2*3/4*S
    assert multiworker.ring_volume(1, 1000) == 0


def test_loopback_tx_reads_the_transmit_columns():
    assert multiworker.loopback_tx(PROC_NET_DEV) == (52157316, 71740)
    assert multiworker.loopback_tx(PROC_NET_DEV, "eth0") == (421915, 3861)


def test_loopback_tx_names_a_missing_interface():
    with pytest.raises(ValueError, match="No interface 'wlan0'"):
        multiworker.loopback_tx(PROC_NET_DEV, "wlan0")


def test_socket_counters_keep_the_cluster_sockets_only():
    assert multiworker.socket_counters(SS, [33285]) == {
        (52356, 33285): {"bytes_sent": 100000, "bytes_retrans": 65536},
        (33285, 52356): {"bytes_sent": 0, "bytes_retrans": 0},
    }
    assert multiworker.socket_counters(SS, [1]) == {}


def test_counter_between_counts_new_sockets_from_zero():
    before = {(1, 2): {"bytes_sent": 100}, (2, 1): {"bytes_sent": 50}}
    after = {(1, 2): {"bytes_sent": 400}, (2, 1): {"bytes_sent": 60}, (3, 2): {"bytes_sent": 7}}
    assert multiworker.counter_between(before, after, "bytes_sent") == 300 + 10 + 7


def test_busy_cpu_seconds_leaves_out_idle_and_iowait():
    stat = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n"
    assert multiworker.busy_cpu_seconds(stat, 100) == pytest.approx(
        (100 + 5 + 50 + 3 + 2 + 1) / 100
    )


def test_other_load_is_busy_time_not_ours_per_second():
    assert multiworker.other_load(busy_s=3.0, our_cpu_s=2.0, seconds=2.0) == 0.5
    assert multiworker.other_load(busy_s=1.9, our_cpu_s=2.0, seconds=2.0) == 0.0


def test_count_collectives_looks_into_the_function_library():
    node = lambda op: SimpleNamespace(op=op)  # noqa: E731
    graph = SimpleNamespace(
        node=[node("CollectiveReduceV2"), node("MatMul")],
        library=SimpleNamespace(
            function=[SimpleNamespace(node_def=[node("CollectiveReduceV2"), node("Relu")])]
        ),
    )
    assert multiworker.count_collectives(graph) == {"CollectiveReduceV2": 2}


def test_parse_task_output_takes_that_tasks_last_json_line():
    stdout = (
        '[worker:0] {"step": 1}\n[worker:1] {"step": 9}\n[worker:0] noise\n[worker:0] {"step": 2}\n'
    )
    assert multiworker.parse_task_output(stdout, "worker:0") == {"step": 2}
    assert multiworker.parse_task_output(stdout, "worker:1") == {"step": 9}


def test_parse_task_output_without_json_names_the_task():
    with pytest.raises(ValueError, match="worker:1 printed no JSON"):
        multiworker.parse_task_output('[worker:0] {"a": 1}\n', "worker:1")


def test_parse_args_checks_sizes_and_defaults():
    with pytest.raises(SystemExit):
        multiworker.parse_args(["--batch", "127"])
    with pytest.raises(SystemExit):
        multiworker.parse_args(["--pairs", "0"])
    args = multiworker.parse_args([])
    assert (args.part, args.pairs, args.pin_cpus) == ("both", 7, True)

"""Pure helpers of benchmarks/checkpoint.py (no TensorFlow, no child processes)."""

import json

import pytest
from benchmark_loader import load_benchmark

bench = load_benchmark("checkpoint")


def line(task: str, event: str, moment: float, run: int) -> str:
    payload = json.dumps({"event": event, "time": moment, "run": run})
    return f"[{task}] {bench.EVENT_PREFIX}{payload}"


def test_mb_per_s():
    assert bench.mb_per_s(5_000_000, 2.0) == 2.5
    with pytest.raises(ValueError, match="seconds must be positive. Received: 0"):
        bench.mb_per_s(1, 0)


def test_event_lines_round_trip_through_the_launcher_prefix():
    text = bench.event_line("signal", run=0, signal="KILL")
    events = bench.parse_events(f"noise\n[worker:1] {text}\n[worker:0] Epoch 1/2\n")
    assert len(events) == 1
    assert events[0]["event"] == "signal" and events[0]["task"] == "worker:1"
    assert events[0]["signal"] == "KILL" and isinstance(events[0]["time"], float)


def test_recovery_times_take_the_slowest_worker_of_each_stage():
    output = "\n".join([
        line("worker:0", "process", 0.0, 0),
        line("worker:1", "signal", 10.0, 0),
        line("worker:0", "exit", 10.5, 0),
        line("worker:0", "process", 12.0, 1), line("worker:1", "process", 12.5, 1),
        line("worker:0", "ready", 15.0, 1), line("worker:1", "ready", 16.0, 1),
        line("worker:0", "restored", 16.2, 1), line("worker:1", "restored", 16.5, 1),
        line("worker:0", "first_step", 17.0, 1), line("worker:1", "first_step", 17.5, 1),
    ])
    times = bench.recovery_times(bench.parse_events(output))
    assert times == pytest.approx({
        "signal_to_exit_s": 0.5, "exit_to_process_s": 2.0, "process_to_ready_s": 3.5,
        "ready_to_restored_s": 0.5, "restored_to_first_step_s": 1.0,
        "signal_to_first_resumed_step_s": 7.5,
    })


def test_recovery_times_name_a_missing_event():
    output = line("worker:1", "signal", 1.0, 0)
    with pytest.raises(ValueError, match="no 'process' event of run 1"):
        bench.recovery_times(bench.parse_events(output))


def test_parse_args_refuses_non_positive_sizes():
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])
    assert bench.parse_args([]).units == 1024

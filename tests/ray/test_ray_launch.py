"""`hybridpar launch --engine ray` on the session's real local Ray cluster (`--address`).

The tasks are the small Python tasks of tests/unit/launch_scripts/task.py (no
TensorFlow): each records its pids, TF_CONFIG and environment, so the tests see
where every task ran and that nothing survives the launcher.
"""

import os
import socket
import time

import pytest
from launch_helpers import (
    assert_no_survivors,
    records_of,
    run_launch,
)

pytestmark = pytest.mark.ray
pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')


def ray_launch(ray_address: str, flags: list[str], plan: dict, records, timeout: float = 90):
    return run_launch(["--engine", "ray", "--address", ray_address, *flags], plan, records,
                      timeout=timeout)


def test_every_task_runs_in_its_actor_with_a_tf_config_of_free_node_ports(ray_address,
                                                                          records, monkeypatch):
    monkeypatch.setenv("HYBRIDPAR_TEST_MARK", "forwarded")
    plan = {"*": {"bind": True, "stdout": "to-out", "stderr": "to-err"}}
    result, _ = ray_launch(ray_address, ["--workers", "2", "--console", "all"], plan, records)
    assert result.returncode == 0, result.stderr
    seen = records_of(records)
    assert set(seen) == {"worker:0@0", "worker:1@0"}
    spec = seen["worker:0@0"]["tf_config"]["cluster"]
    assert spec == seen["worker:1@0"]["tf_config"]["cluster"]
    hosts = {address.rpartition(":")[0] for address in spec["worker"]}
    assert hosts == {"127.0.0.1"} and len(set(spec["worker"])) == 2  # node address, own ports
    for name, record in seen.items():
        assert record["mark"] == "forwarded"  # the launcher's HYBRIDPAR_* reach the task
        assert record["cwd"] == os.getcwd()  # the launcher's directory exists on the node
        assert record["pids"][0] != os.getpid()
        task = name.partition("@")[0]
        assert f"[{task}] to-out" in result.stdout.splitlines()
        assert f"[{task}] to-err" in result.stderr.splitlines()
    assert "hybridpar launch: engine ray: " + ray_address in result.stderr
    assert "hybridpar launch: all 2 task(s) exited with 0" in result.stderr


def test_default_console_and_task_logs_are_the_local_engines(ray_address, records, tmp_path):
    plan = {"*": {"progress": 20, "stdout": "plain"}}
    result, _ = ray_launch(ray_address, ["--workers", "2", "--log-dir", str(tmp_path / "l")],
                           plan, records)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert "[worker:0] plain" in out and not any(line.startswith("[worker:1]") for line in out)
    assert out.count("[worker:0] 20/20 " + "━" * 20 + " - loss: 0.0500") == 1
    assert "\r" not in result.stdout
    assert "20/20 " in (tmp_path / "l" / "worker-1.log").read_text()


def test_a_failing_task_stops_the_others_and_their_children(ray_address, records):
    plan = {"worker:0": {"wait_for": ["worker:1"], "exit": 3},
            "worker:1": {"grandchild": True, "sleep": 600}}
    result, elapsed = ray_launch(ray_address, ["--workers", "2", "--grace", "2"], plan, records)
    assert result.returncode == 3, result.stderr
    assert elapsed < 60
    assert len(records_of(records)["worker:1@0"]["pids"]) == 2
    assert_no_survivors(records)
    assert "task worker:0 exited with 3; stopped the other tasks; exit code 3" in result.stderr


def test_max_restarts_start_new_actors_on_new_ports(ray_address, records):
    plan = {"worker:1@0": {"kill": True}}
    result, _ = ray_launch(ray_address, ["--workers", "2", "--max-restarts", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert "task worker:1 exited with 137; restarting the cluster (restart 1 of 1)" in (
        result.stderr)
    seen = records_of(records)
    first = set(seen["worker:0@0"]["tf_config"]["cluster"]["worker"])
    second = set(seen["worker:0@1"]["tf_config"]["cluster"]["worker"])
    assert first.isdisjoint(second)


def test_parameter_server_mode_restarts_a_dead_worker_alone(ray_address, records):
    plan = {"chief:0": {"wait_for": ["worker:1@1"]}, "worker:1@0": {"exit": 9},
            "worker:0": {"sleep": 60}, "ps:0": {"sleep": 60}, "worker:1@1": {"sleep": 60}}
    result, _ = ray_launch(ray_address, ["--workers", "2", "--ps", "1", "--max-restarts", "1"],
                           plan, records)
    assert result.returncode == 0, result.stderr
    assert ("task worker:1 exited with 9; restarting it alone at the same address "
            "(restart 1 of 1)") in result.stderr
    seen = records_of(records)
    assert seen["worker:1@0"]["tf_config"] == seen["worker:1@1"]["tf_config"]
    assert "task chief:0 exited with 0; stopped the worker and ps tasks" in result.stderr
    assert_no_survivors(records)


def test_timeout_stops_the_tasks(ray_address, records):
    result, elapsed = ray_launch(ray_address, ["--workers", "2", "--timeout", "10", "--grace",
                                               "1"], {"*": {"sleep": 600}}, records)
    assert result.returncode == 124, result.stderr
    assert elapsed < 60
    assert_no_survivors(records)


def test_more_cpus_per_task_than_the_cluster_has_fails_before_any_task(ray_address, records):
    result, _ = ray_launch(ray_address, ["--workers", "2", "--cpus-per-task", "64"], {}, records)
    assert result.returncode == 2
    assert ("--cpus-per-task 64 asks for more CPUs per task than any node of the Ray cluster "
            "has: the largest node has 6 CPU(s)") in result.stderr
    assert not records_of(records)
    result, _ = ray_launch(ray_address, ["--workers", "4", "--cpus-per-task", "2"], {}, records)
    assert result.returncode == 2
    assert "4 task(s) x --cpus-per-task 2 = 8 CPUs, but the Ray cluster has 6 CPU(s)" in (
        result.stderr)
    result, _ = ray_launch(ray_address, ["--workers", "1", "--gpus-per-task", "1"], {}, records)
    assert result.returncode == 2
    assert "--gpus-per-task 1 asks for more GPUs per task than any node" in result.stderr
    assert "the largest node has 0 GPU(s)" in result.stderr
    assert not records_of(records)


def test_an_unreachable_address_fails_fast_with_a_clear_error(records):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    result, _ = run_launch(["--engine", "ray", "--address", address, "--workers", "2"], {},
                           records)
    assert result.returncode == 2
    assert f"cannot reach the Ray cluster at --address {address} within 5 s" in result.stderr
    assert "omit --address to start a local Ray instance" in result.stderr
    assert time.monotonic() - started < 30
    assert not records_of(records)

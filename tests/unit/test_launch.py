"""`hybridpar launch` and `hybridpar tf-config`: pure logic, then real local clusters.

The cluster tests run ``python -m hybridpar.launch`` in a subprocess with small
Python tasks (tests/unit/launch_scripts/task.py, no TensorFlow); every task records
its pids, so the tests can check by pid that nothing survives the launcher.
"""

import io
import json
import os
import re
import signal
import subprocess
import time

import pytest
from launch_helpers import (
    LAUNCH,
    _command,
    _env,
    all_pids,
    assert_no_survivors,
    records_of,
    run_launch,
    wait_for_records,
)

from hybridpar import exit_codes
from hybridpar.launch import args, local, ports, processes, tasks
from hybridpar.launch.options import DEFAULT_CPUS_PER_TASK, LaunchOptions
from hybridpar.launch.tasks import Outcome, UsageError
from hybridpar.topology import cluster
from hybridpar.topology.cluster import Task, parse_tf_config

# --------------------------------------------------------------------------- pure logic


def test_task_layout_worker_only_and_parameter_server():
    assert [str(t) for t in tasks.task_layout(3)] == ["worker:0", "worker:1", "worker:2"]
    assert [str(t) for t in tasks.task_layout(2, 2)] == [
        "chief:0", "worker:0", "worker:1", "ps:0", "ps:1"]
    assert tasks.is_ps_mode(tasks.task_layout(1, 1))
    assert not tasks.is_ps_mode(tasks.task_layout(2))


def test_cluster_spec_and_tf_config_parse_back():
    layout = tasks.task_layout(2, 1)
    addresses = ["h:1", "h:2", "h:3", "h:4"]
    spec = cluster.cluster_spec(layout, addresses)
    assert spec == {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    config = tasks.make_tf_config(spec, "worker", 1)
    assert config == {"cluster": spec, "task": {"type": "worker", "index": 1}}
    info = parse_tf_config(json.dumps(config))
    assert (info.task_type, info.task_index, info.num_ps, info.is_chief) == ("worker", 1, 1, False)


def test_task_environment_adds_tf_config_task_restart_and_unbuffered():
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]}
    env = tasks.task_environment({"PATH": "/bin", "TF_CONFIG": "old"}, cluster,
                                  Task("worker", 1), restart=2)
    assert env["PATH"] == "/bin"
    assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster,
                                            "task": {"type": "worker", "index": 1}}
    assert (env["HYBRIDPAR_TASK"], env["HYBRIDPAR_RESTART"], env["PYTHONUNBUFFERED"]) == (
        "worker:1", "2", "1")


@pytest.mark.parametrize("text", ["10.0.0.1:2222", "host-a.example:1", "[::1]:65535", " h:80 "])
def test_parse_address_accepts(text):
    assert ports.parse_address(text) == text.strip()


@pytest.mark.parametrize("text, match", [
    ("host", "is not host:port"),
    (":2222", "is not host:port"),
    ("host:", "invalid port ''"),
    ("host:0", "invalid port '0'"),
    ("host:65536", "invalid port '65536'"),
    ("host:abc", "invalid port 'abc'"),
    ("::1:22", "is not host:port"),
])
def test_parse_address_refuses(text, match):
    with pytest.raises(UsageError, match=match) as info:
        ports.parse_address(text, "--workers")
    assert f"Received: --workers {text!r}" in str(info.value)


def test_parse_address_list_refuses_empty_items():
    assert ports.parse_address_list("a:1,b:2", "--ps") == ["a:1", "b:2"]
    with pytest.raises(UsageError, match="without empty items.*Received: --ps 'a:1,'"):
        ports.parse_address_list("a:1,", "--ps")


def test_exit_status_and_what_ends_the_cluster():
    assert exit_codes.exit_status(0) == 0
    assert exit_codes.exit_status(3) == 3
    assert exit_codes.exit_status(-signal.SIGKILL) == 137
    assert exit_codes.describe_status(137) == "137 (killed by SIGKILL)"
    assert exit_codes.describe_status(3) == "3"
    assert exit_codes.describe_status(42) == "42 (preempted, saved a checkpoint)"
    assert tasks.ends_cluster(Task("worker", 1), 3, ps_mode=False)
    assert not tasks.ends_cluster(Task("worker", 0), 0, ps_mode=False)
    assert tasks.ends_cluster(Task("chief", 0), 0, ps_mode=True)
    assert not tasks.ends_cluster(Task("ps", 0), 0, ps_mode=True)
    assert tasks.ends_cluster(Task("ps", 0), 1, ps_mode=True)


def test_summary_and_restart_lines():
    assert tasks.restart_line(Task("worker", 1), 137, 1, 2) == (
        "task worker:1 exited with 137; restarting the cluster (restart 1 of 2)")
    assert tasks.restart_line(Task("worker", 0), 42, 1, 1) == (
        "task worker:0 exited with 42 (preempted, saved a checkpoint); restarting the cluster "
        "(restart 1 of 1)")
    failed = Outcome("failed", 137, Task("worker", 1))
    assert tasks.summary_line(failed, 2, False, None) == (
        "task worker:1 exited with 137 (killed by SIGKILL); stopped the other tasks; exit code 137")
    assert "timed out" in tasks.summary_line(Outcome("timeout", 124), 2, False, 2.0)
    interrupted = Outcome("signal", 130, signum=signal.SIGINT)
    assert "received SIGINT" in tasks.summary_line(interrupted, 2, False, None)
    chief = Outcome("finished", 0, Task("chief", 0))
    assert "task chief:0 exited with 0; stopped the worker and ps tasks" in tasks.summary_line(
        chief, 3, True, None)


def test_pick_ports_are_distinct_and_avoid_excluded():
    picks = iter([5000, 5000, 5001, 5002, 5003])
    assert ports.pick_ports(2, exclude=[5001], pick=lambda: next(picks)) == [5000, 5002]
    picked = ports.pick_ports(4)
    assert len(set(picked)) == 4
    assert len(set(ports.pick_ports(3, pick=ports._bind_free_port))) == 3


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv, match", [
    (["--workers", "2"], r"missing the command to run: put it after `--`\. "
                         r"Received: hybridpar launch --workers 2\."),
    (["--workers", "2", "--"], r"missing the command"),
    (["--workers", "2", "python", "train.py"],
     r"the command must come after `--`\. Received: hybridpar launch --workers 2 python train\.py"),
    (["--workers", "0", "--", "true"], r"--workers must be at least 1\. Received: --workers 0"),
    (["--workers", "1", "--ps", "-1", "--", "true"], r"--ps must be 0 or more\. Received: --ps -1"),
    (["--workers", "1", "--max-restarts", "-2", "--", "true"],
     r"--max-restarts must be 0 or more\. Received: --max-restarts -2"),
    (["--workers", "1", "--timeout", "0", "--", "true"],
     r"--timeout must be a positive number of seconds\. Received: --timeout 0"),
    (["--workers", "1", "--timout", "3", "--", "true"], r'Did you mean "--timeout"\?'),
    (["--workers", "two", "--", "true"], r"invalid int value: 'two'"),
    (["--", "true"], r"the following arguments are required: --workers"),
    (["--engine", "rya", "--workers", "1", "--", "true"],
     r"unknown --engine 'rya'\. Did you mean \"ray\"\? Choose one of: local, ray\. "
     r"Received: --engine rya\."),
    (["--console", "everything", "--workers", "1", "--", "true"],
     r"unknown --console 'everything'\..*Choose one of: chief, all"),
    (["--address", "10.0.0.1:6379", "--workers", "1", "--", "true"],
     r"--address is for the Ray engine\. Received: --address 10\.0\.0\.1:6379 with --engine "
     r"local\. Add --engine ray, or drop --address\."),
    (["--engine", "ray", "--cpus-per-task", "-1", "--workers", "1", "--", "true"],
     r"--cpus-per-task must be 0 or more\. Received: --cpus-per-task -1\."),
])
def test_launch_bad_input_exits_2_with_a_clear_message(argv, match, capsys):
    assert args.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybridpar launch: error: ")
    assert re.search(match, err), err
    assert "Run `hybridpar launch --help` for usage." in err


def test_engine_ray_without_ray_installed_names_the_extra(tmp_path):
    stub = tmp_path / "no_ray" / "ray"  # shadows the installed ray, as if it were missing
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**_env(), "PYTHONPATH": str(stub.parent)}
    result = subprocess.run([*LAUNCH, "--engine", "ray", "--workers", "1", "--log-dir",
                             str(tmp_path / "logs"), "--", "true"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert ('hybridpar launch: error: --engine ray needs Ray, which is not installed. Install it '
            'with pip install -e ".[ray]"') in result.stderr


def test_launch_help_exits_0(capsys):
    assert args.main(["--help"]) == 0
    assert "--max-restarts" in capsys.readouterr().out


def test_ignored_sighup_stays_ignored_but_sigint_is_always_handled():
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a background job
    try:
        with processes.SignalWatcher() as watcher:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)  # still stops the cluster
            time.sleep(0.1)
            assert watcher.first() == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous_hup)
        signal.signal(signal.SIGINT, previous_int)


def test_launch_function_refuses_empty_command():
    with pytest.raises(UsageError, match="no command to run"):
        local.launch([], 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, r"--workers must be at least 1\. Received: --workers 0"),
    ({"max_restarts": -1}, r"--max-restarts must be 0 or more"),
    ({"timeout": 0.0}, r"--timeout must be a positive number"),
    ({"console": "cheif"}, r"unknown --console 'cheif'\. Did you mean \"chief\"\?"),
    ({"engine": "rya"}, r"unknown --engine 'rya'\. Did you mean \"ray\"\?"),
    ({"cpus_per_task": 2.0}, r"--cpus-per-task is for the Ray engine\. Received: "
                             r"--cpus-per-task 2\.0 with --engine local"),
    ({"engine": "ray", "gpus_per_task": -1.0}, r"--gpus-per-task must be 0 or more"),
])
def test_launch_options_are_checked_when_built_whatever_the_way_in(kwargs, match):
    """The flags and ``hybridpar.launch.launch(...)`` meet the same checks, made once."""
    with pytest.raises(UsageError, match=match):
        LaunchOptions(**{"command": ["python", "t.py"], "workers": 2, **kwargs})


def test_ray_reservations_default_in_one_place():
    local_options = LaunchOptions(["python"], 1)
    ray_options = LaunchOptions(["python"], 1, engine="ray", cpus_per_task=0.5)
    assert (local_options.cpus, local_options.gpus) == (DEFAULT_CPUS_PER_TASK, 0.0)
    assert (ray_options.cpus, ray_options.gpus) == (0.5, 0.0)
    help_text = " ".join(args._launch_parser().format_help().split())
    assert f"(default {DEFAULT_CPUS_PER_TASK:g})" in help_text


# --------------------------------------------------------------------------- tf-config


def test_tf_config_prints_json(capsys):
    argv = ["--workers", "h1:2222,h2:2222", "--chief", "h0:2222", "--ps", "h3:2222",
            "--index", "1"]
    assert args.tf_config_main(argv) == 0
    config = json.loads(capsys.readouterr().out)
    assert config == {
        "cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert parse_tf_config(json.dumps(config)).task_index == 1
    assert args.tf_config_main(["--workers", "a:1", "--chief", "c:2", "--type", "chief",
                                  "--index", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize("argv, match", [
    (["--workers", "h1:1,h2:2", "--index", "2"],
     r"--index 2 is out of range for job 'worker' with 2 task\(s\); valid: 0\.\.1"),
    (["--workers", "h1:1", "--index", "-1"], r"--index -1 is out of range"),
    (["--workers", "h1:1", "--ps", "p:1", "--type", "ps", "--index", "1"],
     r"out of range for job 'ps' with 1 task\(s\); valid: 0\.\.0"),
    (["--workers", "h1", "--index", "0"], r"'h1' is not host:port.*Received: --workers 'h1'"),
    (["--workers", "h1:99999", "--index", "0"], r"invalid port '99999'.*1\.\.65535"),
    (["--workers", "h1:1", "--chief", "c:0", "--index", "0"], r"Received: --chief 'c:0'"),
    (["--workers", "h1:1", "--type", "wroker", "--index", "0"],
     r"unknown task type 'wroker'\. Did you mean \"worker\"\?"),
    (["--workers", "h1:1", "--type", "chief", "--index", "0"],
     r"the cluster has no 'chief' tasks.*Pass --chief"),
    (["--workers", "h1:1,h1:1", "--index", "0"], r"h1:1 is given to both worker:0 and worker:1"),
    (["--workers", "h1:1"], r"the following arguments are required: --index"),
])
def test_tf_config_errors_exit_2(argv, match, capsys):
    assert args.tf_config_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("hybridpar tf-config: error: ")
    assert re.search(match, captured.err), captured.err


# --------------------------------------------------------------------------- real clusters


def test_each_task_gets_its_own_tf_config_on_distinct_free_ports(records):
    names = ["worker:0", "worker:1", "worker:2"]
    plan = {"*": {"bind": True, "wait_for": names}}
    result, _ = run_launch(["--workers", "3"], plan, records)
    assert result.returncode == 0, result.stderr
    got = records_of(records)
    assert sorted(got) == [f"{name}@0" for name in names]
    addresses = got["worker:0@0"]["tf_config"]["cluster"]["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    for index, name in enumerate(names):
        config = got[f"{name}@0"]["tf_config"]
        assert config == {"cluster": {"worker": addresses},
                          "task": {"type": "worker", "index": index}}
        assert got[f"{name}@0"]["unbuffered"] == "1"
    assert f"hybridpar launch: starting 3 task(s) (worker-only): worker:0={addresses[0]}" \
        in result.stderr
    assert "hybridpar launch: all 3 task(s) exited with 0" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].endswith("exit code 0")


def test_output_is_prefixed_by_task_and_keeps_stdout_and_stderr_apart(records):
    plan = {"*": {"stdout": "to-out", "stderr": "to-err"}, "worker:1": {"tail": "no newline"}}
    result, _ = run_launch(["--workers", "2", "--console", "all"], plan, records)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] to-out" in out and f"[{task}] to-out" not in err
        assert f"[{task}] to-err" in err and f"[{task}] to-err" not in out
        assert any(line.startswith(f"[{task}] record ") for line in out)
    assert "[worker:1] no newline" in out
    assert all(line.startswith("[worker:") for line in out), out


def test_failing_task_stops_the_others_and_their_children(records):
    plan = {
        "worker:0": {"wait_for": ["worker:1"], "exit": 3},
        "worker:1": {"grandchild": True, "sleep": 600},
    }
    result, elapsed = run_launch(["--workers", "2"], plan, records)
    assert result.returncode == 3, result.stderr
    assert elapsed < 30
    assert len(records_of(records)["worker:1@0"]["pids"]) == 2  # the task and its `sleep 600`
    assert_no_survivors(records)
    assert "hybridpar launch: task worker:0 exited with 3; stopped the other tasks; exit code 3" \
        in result.stderr


def test_task_killed_by_a_signal_counts_as_failed(records):
    plan = {"worker:0": {"wait_for": ["worker:1"], "kill": True}, "worker:1": {"sleep": 600}}
    result, elapsed = run_launch(["--workers", "2"], plan, records)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "task worker:0 exited with 137 (killed by SIGKILL)" in result.stderr
    assert elapsed < 30
    assert_no_survivors(records)


def test_task_ignoring_sigterm_is_killed_after_the_grace_period(records):
    plan = {
        "worker:0": {"wait_for": ["worker:1"], "exit": 5},
        "worker:1": {"ignore_term": True, "grandchild": True, "sleep": 600},
    }
    result, elapsed = run_launch(["--workers", "2", "--grace", "1"], plan, records)
    assert result.returncode == 5, result.stderr
    assert 1 <= elapsed < 30
    assert_no_survivors(records)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_stops_everything(signum, records):
    plan = {"*": {"grandchild": True, "sleep": 600}}
    proc = subprocess.Popen([*LAUNCH, "--workers", "2", "--", *_command(plan, records)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        wait_for_records(records, ["worker:0@0", "worker:1@0"])
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err  # 130 for SIGINT, 143 for SIGTERM
    name = signal.Signals(signum).name
    assert f"hybridpar launch: received {name}; stopped all tasks; exit code {128 + signum}" in err
    assert len(all_pids(records)) == 4
    assert_no_survivors(records)


def test_timeout_stops_everything_and_exits_124(records):
    plan = {"*": {"grandchild": True, "sleep": 600}}
    result, elapsed = run_launch(["--workers", "2", "--timeout", "2"], plan, records)
    assert result.returncode == 124, result.stderr
    assert 2 <= elapsed < 15
    assert "timed out: the cluster did not finish within --timeout 2 seconds" in result.stderr
    assert_no_survivors(records)


def test_max_restarts_starts_the_cluster_again_on_new_ports(records):
    plan = {"worker:1@0": {"wait_for": ["worker:0"], "exit": 3}, "worker:0@0": {"sleep": 600}}
    result, _ = run_launch(["--workers", "2", "--max-restarts", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert ("hybridpar launch: task worker:1 exited with 3; restarting the cluster "
            "(restart 1 of 1)") in result.stderr
    got = records_of(records)
    assert sorted(got) == ["worker:0@0", "worker:0@1", "worker:1@0", "worker:1@1"]
    first = set(got["worker:0@0"]["tf_config"]["cluster"]["worker"])
    second = set(got["worker:0@1"]["tf_config"]["cluster"]["worker"])
    assert not first & second
    assert_no_survivors(records)


def test_without_restarts_the_failure_code_is_returned(records):
    plan = {"worker:1@0": {"exit": 3}}
    result, _ = run_launch(["--workers", "2", "--max-restarts", "0"], plan, records)
    assert result.returncode == 3, result.stderr
    assert "restarting" not in result.stderr
    assert "@1" not in " ".join(records_of(records))


def test_restarts_exhausted_returns_the_last_failure(records):
    plan = {"worker:0": {"exit": 4}}
    result, _ = run_launch(["--workers", "1", "--max-restarts", "2"], plan, records)
    assert result.returncode == 4, result.stderr
    assert result.stderr.count("restarting the cluster") == 2
    assert "(restart 2 of 2)" in result.stderr
    assert sorted(records_of(records)) == ["worker:0@0", "worker:0@1", "worker:0@2"]


def test_parameter_server_mode_ends_when_the_chief_exits(records):
    others = ["worker:0", "worker:1", "ps:0"]
    plan = {"*": {"grandchild": True, "sleep": 600}, "chief:0": {"wait_for": others, "sleep": 0}}
    result, elapsed = run_launch(["--workers", "2", "--ps", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert elapsed < 30
    got = records_of(records)
    cluster = got["chief:0@0"]["tf_config"]["cluster"]
    assert [len(cluster[job]) for job in ("chief", "worker", "ps")] == [1, 2, 1]
    assert len({a for addrs in cluster.values() for a in addrs}) == 4
    for name in ["chief:0", *others]:
        job, index = name.split(":")
        assert got[f"{name}@0"]["tf_config"] == {"cluster": cluster,
                                                 "task": {"type": job, "index": int(index)}}
    assert "task chief:0 exited with 0; stopped the worker and ps tasks; exit code 0" \
        in result.stderr
    assert_no_survivors(records)


def test_parameter_server_mode_returns_the_chief_failure(records):
    chief = {"wait_for": ["worker:0", "ps:0"], "sleep": 0, "exit": 7}
    plan = {"*": {"sleep": 600}, "chief:0": chief}
    result, _ = run_launch(["--workers", "1", "--ps", "1"], plan, records)
    assert result.returncode == 7, result.stderr
    assert_no_survivors(records)


def test_what_a_task_exit_means_in_parameter_server_mode():
    exit_ = tasks.ps_mode_exit
    assert exit_(Task("chief", 0), 0, workers_alive=2, restarts_left=3) == "end"
    assert exit_(Task("chief", 0), 1, workers_alive=2, restarts_left=3) == "end"
    assert exit_(Task("worker", 1), 137, workers_alive=1, restarts_left=1) == "restart_task"
    assert exit_(Task("worker", 1), 137, workers_alive=1, restarts_left=0) == "keep_going"
    assert exit_(Task("worker", 1), 137, workers_alive=0, restarts_left=0) == "end"
    assert exit_(Task("ps", 1), 137, workers_alive=2, restarts_left=3) == "keep_going"
    assert tasks.task_restart_line(Task("worker", 1), 137, 1, 2) == (
        "task worker:1 exited with 137 (killed by SIGKILL); restarting it alone at the same "
        "address (restart 1 of 2)")


def test_parameter_server_mode_goes_on_without_a_dead_worker(records):
    chief = {"wait_for": ["worker:1", "ps:0"], "sleep": 1, "stdout": "chief done"}
    plan = {"*": {"sleep": 600}, "worker:1": {"wait_for": ["worker:0"], "sleep": 0, "kill": True},
            "chief:0": chief}
    result, _ = run_launch(["--workers", "2", "--ps", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert "[chief:0] chief done" in result.stdout
    assert "restarting" not in result.stderr
    assert_no_survivors(records)


def test_parameter_server_mode_restarts_a_dead_worker_alone_at_its_address(records):
    plan = {"*": {"sleep": 600}, "worker:1@0": {"wait_for": ["worker:0"], "sleep": 0, "exit": 3},
            "chief:0": {"wait_for": ["worker:1@1"], "sleep": 0}}
    result, _ = run_launch(["--workers", "2", "--ps", "1", "--max-restarts", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert ("task worker:1 exited with 3; restarting it alone at the same address "
            "(restart 1 of 1)") in result.stderr
    got = records_of(records)
    assert sorted(got) == ["chief:0@0", "ps:0@0", "worker:0@0", "worker:1@0", "worker:1@1"]
    assert got["worker:1@1"]["tf_config"] == got["worker:1@0"]["tf_config"]
    assert_no_survivors(records)


def test_parameter_server_mode_restarts_the_cluster_when_the_chief_fails(records):
    plan = {"*": {"sleep": 600}, "chief:0@0": {"wait_for": ["ps:0"], "sleep": 0, "exit": 5},
            "chief:0@1": {"wait_for": ["ps:0@1", "worker:0@1"], "sleep": 0}}
    result, _ = run_launch(["--workers", "1", "--ps", "1", "--max-restarts", "1"], plan, records)
    assert result.returncode == 0, result.stderr
    assert "task chief:0 exited with 5; restarting the cluster (restart 1 of 1)" in result.stderr
    assert sorted(records_of(records)) == ["chief:0@0", "chief:0@1", "ps:0@0", "ps:0@1",
                                           "worker:0@0", "worker:0@1"]
    assert_no_survivors(records)


def test_command_that_cannot_start_exits_127(tmp_path):
    result = subprocess.run([*LAUNCH, "--workers", "2", "--", str(tmp_path / "no-such-program")],
                            capture_output=True, text=True, env=_env(), timeout=30)
    assert result.returncode == 127
    assert "cannot start" in result.stderr and "no-such-program" in result.stderr


def test_launch_in_process_writes_to_the_given_streams(records):
    out, err = io.StringIO(), io.StringIO()
    code = local.launch(_command({"*": {"stdout": "hello"}}, records), 2,
                         env=_env(), stdout=out, stderr=err, console="all")
    assert code == 0, err.getvalue()
    assert "[worker:0] hello" in out.getvalue().splitlines()
    assert "[worker:1] hello" in out.getvalue().splitlines()
    assert err.getvalue().startswith("hybridpar launch: starting 2 task(s)")


# --------------------------------------------------------------------------- Ray engine, pure


def test_ray_resource_checks_name_both_numbers():
    from hybridpar.launch import ray_engine

    nodes = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0}]
    ray_engine.check_resources(nodes, 6, 1, 0)  # fits
    with pytest.raises(UsageError, match=r"--cpus-per-task 8 asks for more CPUs per task than "
                                         r"any node of the Ray cluster has: the largest node has "
                                         r"4 CPU\(s\) \(2 node\(s\), 6 in all\)"):
        ray_engine.check_resources(nodes, 1, 8, 0)
    with pytest.raises(UsageError, match=r"3 task\(s\) x --gpus-per-task 1 = 3 GPUs, but the "
                                         r"Ray cluster has 1 GPU\(s\) in all"):
        ray_engine.check_resources(nodes, 3, 1, 1)


def test_ray_engine_forwards_hybridpar_and_tf_variables_but_not_tf_config():
    from hybridpar.launch import ray_engine

    environ = {"HYBRIDPAR_LOGICAL_CPUS": "2", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": "{}",
               "PATH": "/bin", "HOME": "/root"}
    assert ray_engine.forwarded_environment(environ) == {
        "HYBRIDPAR_LOGICAL_CPUS": "2", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("address", ["head", "head:port", ":6379"])
def test_ray_address_must_be_host_port(address):
    from hybridpar.launch import ray_engine

    with pytest.raises(UsageError, match=r"--address expects the host:port of a Ray cluster's "
                                         rf"head .* Received: --address {address}\."):
        ray_engine.probe_address(address)


def test_launch_options_give_the_task_layout_to_every_engine():
    options = args.parse_launch_args(["--engine", "ray", "--workers", "2", "--ps", "1",
                                      "--cpus-per-task", "2", "--", "python", "t.py"])
    assert (options.engine, options.cpus_per_task, options.console) == ("ray", 2.0, "chief")
    assert [str(t) for t in options.tasks] == ["chief:0", "worker:0", "worker:1", "ps:0"]

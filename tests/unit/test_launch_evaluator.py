"""`hybridpar launch --evaluator` and `hybridpar tf-config --evaluator`: pure logic, then clusters.

The clusters run the small tasks of tests/unit/launch_scripts/task.py (no
TensorFlow), with the helpers of tests/launch_helpers.py, every task shown whole.
"""

import json

import pytest
from launch_helpers import assert_no_survivors, records_of, run_launch

from hybridpar.launch import args, tasks
from hybridpar.launch.tasks import Outcome, UsageError
from hybridpar.topology.cluster import Task, cluster_spec, parse_tf_config

EVALUATOR = Task("evaluator", 0)


def test_the_layout_ends_with_one_evaluator_in_both_modes():
    assert [str(t) for t in tasks.task_layout(2, evaluator=True)] == [
        "worker:0", "worker:1", "evaluator:0"]
    assert [str(t) for t in tasks.task_layout(2, 1, evaluator=True)] == [
        "chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    assert tasks.has_evaluator(tasks.task_layout(1, evaluator=True))
    assert not tasks.has_evaluator(tasks.task_layout(1, 1))


def test_the_evaluator_tf_config_names_the_whole_cluster_and_parses_back():
    layout = tasks.task_layout(1, 1, evaluator=True)
    spec = cluster_spec(layout, ["h:1", "h:2", "h:3", "h:4"])
    assert spec == {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"], "evaluator": ["h:4"]}
    info = parse_tf_config(json.dumps(tasks.make_tf_config(spec, "evaluator", 0)))
    assert info.is_evaluator and not info.is_chief
    assert info.num_workers == 2 and info.training_jobs == {
        "chief": ("h:1",), "worker": ("h:2",), "ps": ("h:3",)}


def test_an_evaluator_exit_never_ends_the_cluster_by_itself():
    assert not tasks.ends_cluster(EVALUATOR, 1, ps_mode=False)
    assert not tasks.ends_cluster(EVALUATOR, 0, ps_mode=True)
    assert tasks.ends_cluster(Task("chief", 0), 0, ps_mode=True, evaluator_running=False)
    assert not tasks.ends_cluster(Task("chief", 0), 0, ps_mode=True, evaluator_running=True)
    assert tasks.ends_cluster(Task("chief", 0), 1, ps_mode=True, evaluator_running=True)


def test_parameter_server_mode_is_done_when_the_chief_and_the_evaluator_are():
    exit_ = tasks.ps_mode_exit
    chief, worker = Task("chief", 0), Task("worker", 0)
    assert exit_(chief, 0, 2, 0, evaluator_running=True) == "keep_going"
    assert exit_(chief, 3, 2, 0, evaluator_running=True) == "end"
    assert exit_(EVALUATOR, 1, 2, 0) == "keep_going"  # training goes on
    assert exit_(EVALUATOR, 0, 2, 0, chief_done=True) == "end"
    assert exit_(EVALUATOR, 1, 2, 0, chief_done=True) == "end"
    # After the chief finished only the evaluator matters: a worker's exit restarts nothing.
    assert exit_(worker, 137, 0, 3, chief_done=True) == "keep_going"


def test_summary_and_evaluator_lines():
    done = Outcome("finished", 0, Task("worker", 1), evaluator_status=1)
    assert tasks.summary_line(done, 2, False, None) == (
        "all 2 training task(s) exited with 0 (the last was worker:1); evaluator:0 exited "
        "with 1; exit code 0")
    chief = Outcome("finished", 0, Task("chief", 0), evaluator_status=0)
    assert tasks.summary_line(chief, 3, True, None) == (
        "task chief:0 exited with 0; evaluator:0 exited with 0; stopped the worker and ps "
        "tasks; exit code 0")
    assert tasks.evaluator_exit_line(0, training_done=False) is None
    assert tasks.evaluator_exit_line(1, training_done=False) == (
        "task evaluator:0 exited with 1 while training goes on without it (see its output "
        "above; the evaluator is not restarted)")
    assert "after training ended" in tasks.evaluator_exit_line(137, training_done=True)


def test_launch_flag_and_tf_config_for_the_evaluator():
    options = args.parse_launch_args(["--workers", "2", "--evaluator", "--", "python", "t.py"])
    assert options.evaluator and options.workers == 2
    assert not args.parse_launch_args(["--workers", "2", "--", "python"]).evaluator
    # LaunchOptions.tasks is every engine's layout: the Ray engine starts the evaluator too.
    ray = args.parse_launch_args(["--engine", "ray", "--workers", "1", "--ps", "1",
                                  "--evaluator", "--", "python", "t.py"])
    assert [str(t) for t in ray.tasks] == ["chief:0", "worker:0", "ps:0", "evaluator:0"]
    config = args.tf_config_from_args(
        ["--workers", "a:1,b:2", "--evaluator", "c:3", "--type", "evaluator", "--index", "0"])
    assert config == {"cluster": {"worker": ["a:1", "b:2"], "evaluator": ["c:3"]},
                      "task": {"type": "evaluator", "index": 0}}


@pytest.mark.parametrize("argv, match", [
    (["--workers", "a:1", "--evaluator", "c:3,d:4", "--index", "0"],
     r"at most one evaluator \(TensorFlow's rule\). Received: --evaluator 'c:3,d:4'"),
    (["--workers", "a:1", "--type", "evaluator", "--index", "0"],
     r"the cluster has no 'evaluator' tasks.*Pass --evaluator"),
    (["--workers", "a:1", "--evaluator", "a:1", "--index", "0"],
     r"a:1 is given to both worker:0 and evaluator:0"),
])
def test_bad_evaluator_addresses_are_refused(argv, match):
    with pytest.raises(UsageError, match=match):
        args.tf_config_from_args(argv)


def test_two_evaluators_in_tf_config_are_refused():
    text = json.dumps({"cluster": {"worker": ["a:1"], "evaluator": ["b:1", "c:1"]},
                       "task": {"type": "worker", "index": 0}})
    with pytest.raises(ValueError, match=r"TF_CONFIG lists 2 evaluators; a cluster has at most "
                                         r"one.*Received: evaluator=\['b:1', 'c:1'\]"):
        parse_tf_config(text)


def test_worker_only_cluster_waits_for_the_evaluator(records):
    plan = {"*": {"sleep": 0}, "evaluator:0": {"wait_for": ["worker:1"], "sleep": 1,
                                               "stdout": "evaluated"}}
    result, _ = run_launch(["--console", "all", "--workers", "2", "--evaluator"], plan, records)
    assert result.returncode == 0, result.stderr
    assert "[evaluator:0] evaluated" in result.stdout
    config = records_of(records)["evaluator:0@0"]["tf_config"]
    assert config["task"] == {"type": "evaluator", "index": 0}
    assert set(config["cluster"]) == {"worker", "evaluator"}
    assert ("all 2 training task(s) exited with 0 (the last was worker:") in result.stderr
    assert result.stderr.rstrip().endswith("evaluator:0 exited with 0; exit code 0")
    assert_no_survivors(records)


def test_a_failed_evaluator_is_reported_and_training_goes_on(records):
    plan = {"*": {"wait_for": ["evaluator:0"], "sleep": 1, "stdout": "trained"},
            "evaluator:0": {"wait_for": [], "sleep": 0, "exit": 3}}
    result, _ = run_launch(["--console", "all", "--workers", "1", "--ps", "1", "--evaluator"],
                           {**plan, "ps:0": {"sleep": 600}, "worker:0": {"sleep": 600}}, records)
    assert result.returncode == 0, result.stderr
    assert ("task evaluator:0 exited with 3 while training goes on without it") in result.stderr
    assert "[chief:0] trained" in result.stdout
    assert "task chief:0 exited with 0; evaluator:0 exited with 3; stopped the worker and ps " \
           "tasks; exit code 0" in result.stderr
    assert_no_survivors(records)


def test_parameter_server_cluster_ends_when_the_evaluator_is_done(records):
    plan = {"*": {"sleep": 600}, "chief:0": {"wait_for": ["evaluator:0"], "sleep": 0},
            "evaluator:0": {"wait_for": ["chief:0"], "sleep": 2, "stdout": "last checkpoint"}}
    result, _ = run_launch(["--console", "all", "--workers", "1", "--ps", "1", "--evaluator"],
                           plan, records)
    assert result.returncode == 0, result.stderr
    assert "[evaluator:0] last checkpoint" in result.stdout  # not stopped with the chief
    assert "task chief:0 exited with 0; evaluator:0 exited with 0" in result.stderr
    assert_no_survivors(records)

"""What a parameter-server cluster needs, checked before training (pure logic)."""

import json

import pytest

import hybridpar
from hybridpar import StrategyConfig
from hybridpar.errors import RuntimeMismatchError
from hybridpar.topology.cluster import parse_tf_config
from hybridpar.topology.plan import make_plan
from hybridpar.topology.ps_cluster import check_cluster, ps_tasks_in, root_cause

CPU = ["/device:CPU:0"]


def cluster(task=("chief", 0), **jobs):
    spec = {job: [f"h:{100 * i + j}" for j in range(n)] for i, (job, n) in enumerate(jobs.items())}
    return parse_tf_config(json.dumps({"cluster": spec,
                                       "task": {"type": task[0], "index": task[1]}}))


def ps_config(**partitioner):
    settings = {"data_parallel": {"mode": "parameter_server"}}
    if partitioner:
        settings["parameter_server"] = {"partitioner": partitioner}
    return StrategyConfig.from_dict(settings)


def test_auto_mode_picks_parameter_server_for_a_cluster_with_ps_tasks():
    plan = make_plan(StrategyConfig(), CPU, cluster(chief=1, worker=2, ps=2))
    assert plan.mode == "parameter_server"


def test_a_full_cluster_passes():
    full = cluster(chief=1, worker=2, ps=2)
    assert check_cluster(full, ps_config(kind="fixed", shards=2)) is full


def test_parameter_server_mode_without_tf_config_says_how_to_start_a_cluster():
    with pytest.raises(RuntimeMismatchError, match=r"TF_CONFIG is not set\. Start it with "
                       r"`hybridpar launch --workers 2 --ps 2"):
        make_plan(ps_config(), CPU, None)


@pytest.mark.parametrize("jobs, missing", [
    ({"worker": 2, "ps": 1}, "chief"),
    ({"chief": 1, "worker": 2}, "ps"),
    ({"chief": 1, "ps": 2}, "worker"),
])
def test_a_missing_job_is_named(jobs, missing):
    task = ("chief", 0) if "chief" in jobs else ("worker", 0)
    received = ", ".join(f"{job}={n}" for job, n in jobs.items())
    with pytest.raises(RuntimeMismatchError, match=(
            rf"mode='parameter_server' needs a '{missing}' job in TF_CONFIG .*"
            rf"Received: {received}\. Add the '{missing}' job")):
        make_plan(ps_config(), CPU, cluster(task, **jobs))


@pytest.mark.parametrize("partitioner, key", [
    ({"kind": "fixed", "shards": 3}, "shards=3"),
    ({"kind": "min_size", "min_shard_bytes": 1024, "max_shards": 3}, "max_shards=3"),
])
def test_more_shards_than_ps_tasks_is_refused(partitioner, key):
    with pytest.raises(RuntimeMismatchError, match=(
            rf"partitioner\.{key} but the cluster has 2 ps task\(s\); each shard lives on its "
            r"own ps\. Set \w+ to at most 2, or start more ps tasks \(hybridpar launch --ps 3\)")):
        make_plan(ps_config(**partitioner), CPU, cluster(chief=1, worker=1, ps=2))


def test_lost_ps_tasks_are_named_by_job_or_address():
    full = cluster(chief=1, worker=2, ps=2)  # ps addresses h:200, h:201
    message = "UNAVAILABLE: from /job:ps/replica:0/task:1 ... ipv4:h:200: Connection refused"
    assert ps_tasks_in(message, full) == ["ps:0 (h:200)", "ps:1 (h:201)"]
    assert ps_tasks_in("worker /job:worker/replica:0/task:1 failed", full) == []
    assert ps_tasks_in("ipv4:h:2001 refused", full) == []


def test_root_cause_is_the_unavailable_line():
    message = ("Graph execution error:\n2 root error(s) found.\n  (0) UNAVAILABLE:  failed to "
               "connect to all addresses\n  (1) CANCELLED:  Run")
    assert root_cause(message) == "UNAVAILABLE:  failed to connect to all addresses"
    assert root_cause("Something else\nmore") == "Something else"
    assert root_cause("") == ""


def test_zero_shards_are_refused_by_the_config():
    with pytest.raises(hybridpar.ConfigError, match=r"kind 'fixed' needs shards >= 1\. "
                       r"Received: shards=0"):
        ps_config(kind="fixed", shards=0)


@pytest.mark.parametrize("task", [("chief", 0), ("worker", 1), ("ps", 0)])
def test_initialize_does_not_join_a_parameter_server_cluster(task, monkeypatch):
    import hybridpar.strategies.cluster_join

    joined = []
    monkeypatch.setattr(hybridpar.strategies.cluster_join, "bring_up", joined.append)
    spec = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec,
                                                "task": {"type": task[0], "index": task[1]}}))
    assert hybridpar.initialize().task_type == task[0]
    assert joined == []  # parameter-server tasks start their servers in scope() instead
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:2", "h:3"]},
                                                "task": {"type": "worker", "index": 1}}))
    hybridpar.initialize()
    assert len(joined) == 1  # a multi-worker cluster is joined (at import, by initialize())

"""Runtime planning, device names, the mesh and TF_CONFIG parsing (pure Python)."""

import json
import os

import pytest

from hybridpar import ConfigError, RuntimeMismatchError, StrategyConfig
from hybridpar.config.devices import canonical_device
from hybridpar.topology.cluster import parse_tf_config
from hybridpar.topology.mesh import DeviceMesh
from hybridpar.topology.plan import make_plan

CPUS = [f"/device:CPU:{i}" for i in range(4)]
GPUS = ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1"]


def config(**overrides):
    return StrategyConfig().override(overrides)


@pytest.mark.parametrize(
    "name",
    ["/gpu:1", "GPU:1", "gpu:1", "/device:GPU:1", "/job:localhost/replica:0/task:0/device:GPU:1"],
)
def test_canonical_device_spellings(name):
    assert canonical_device(name) == "/device:GPU:1"


def test_canonical_device_rejects_remote_names():
    with pytest.raises(ConfigError, match="Not a local device name"):
        canonical_device("/job:worker/task:1/device:CPU:0")


def test_auto_uses_every_local_cpu_as_replicas():
    plan = make_plan(config(), CPUS)
    assert plan.mode == "mirrored"
    assert plan.num_replicas == 4
    assert plan.mesh.devices == tuple(CPUS)


def test_auto_prefers_accelerators():
    plan = make_plan(config(), GPUS)
    assert plan.mode == "mirrored"
    assert plan.mesh.devices == ("/device:GPU:0", "/device:GPU:1")


def test_auto_with_one_device_is_none():
    plan = make_plan(config(), ["/device:CPU:0"])
    assert plan.mode == "none" and plan.num_replicas == 1


def test_mode_none_takes_the_first_device():
    plan = make_plan(config(**{"data_parallel.mode": "none"}), CPUS)
    assert plan.mesh.devices == ("/device:CPU:0",)


def test_listed_devices_are_used_in_order():
    plan = make_plan(config(**{"data_parallel.devices": ["/cpu:3", "/cpu:1"]}), CPUS)
    assert plan.mesh.devices == ("/device:CPU:3", "/device:CPU:1")
    assert plan.explicit_devices


def test_missing_device_lists_the_devices_that_exist():
    with pytest.raises(RuntimeMismatchError, match=r"names /device:GPU:0, which this process does "
                       r"not have. Devices that exist: /device:CPU:0, /device:CPU:1"):
        make_plan(config(**{"data_parallel.devices": ["/gpu:0"]}), CPUS[:2])


def test_batch_must_divide_over_the_replicas_that_exist():
    with pytest.raises(RuntimeMismatchError, match=r"global_batch_size=10 does not divide evenly "
                       r"across 4 replicas.*CPU:3"):
        make_plan(config(**{"data.global_batch_size": 10}), CPUS)


def test_more_stages_than_devices():
    with pytest.raises(RuntimeMismatchError, match=r"stages=8 needs at least 8 devices, but only "
                       r"4 are available: /device:CPU:0"):
        make_plan(config(**{"model_parallel.stages": 8}), CPUS)


def test_stages_split_devices_into_replicas():
    plan = make_plan(config(**{"model_parallel.stages": 2}), CPUS)
    assert plan.mesh.replicas == 2 and plan.mesh.stages == 2


def test_auto_picks_cluster_modes_from_tf_config():
    workers = parse_tf_config(json.dumps(
        {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}))
    assert make_plan(config(), ["/device:CPU:0"], workers).mode == "multi_worker"
    assert make_plan(config(), ["/device:CPU:0"], workers).num_replicas == 2
    ps = parse_tf_config(json.dumps(
        {"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},
         "task": {"type": "chief", "index": 0}}))
    assert make_plan(config(), ["/device:CPU:0"], ps).mode == "parameter_server"


def test_mesh_mapping_is_replica_major():
    mesh = DeviceMesh(tuple("abcdef"), stages=3)
    assert mesh.replicas == 2
    assert mesh.device(1, 0) == "d"
    assert mesh.replica_devices(0) == ("a", "b", "c")
    assert mesh.stage_devices(2) == ("c", "f")
    with pytest.raises(IndexError):
        mesh.device(2, 0)


def test_mesh_tensor_groups_are_innermost_and_shard_0_leads():
    mesh = DeviceMesh(tuple("abcdefgh"), stages=2, tensor=2)
    assert mesh.replicas == 2
    assert mesh.group_devices(0, 1) == ("c", "d")
    assert mesh.device(1, 0) == "e" and mesh.device(1, 1, 1) == "h"
    assert mesh.stage_devices(1) == ("c", "g")  # the leaders, where unsplit weights go
    assert mesh.shard_devices(1, 1) == ("d", "h")
    with pytest.raises(IndexError):
        mesh.device(0, 0, 2)


def test_tensor_groups_split_the_devices_into_replicas():
    plan = make_plan(config(**{"model_parallel.tensor": 2}), CPUS)
    assert plan.mode == "mirrored" and plan.mesh.replicas == 2
    assert plan.mesh.stage_devices(0) == (CPUS[0], CPUS[2])
    none = make_plan(config(**{"model_parallel.tensor": 2, "data_parallel.mode": "none"}), CPUS)
    assert none.mesh.devices == tuple(CPUS[:2]) and none.mesh.tensor == 2


def test_stages_times_tensor_that_leaves_devices_idle_is_refused():
    six = [f"/device:CPU:{i}" for i in range(6)]
    with pytest.raises(RuntimeMismatchError, match=r"stages=1 x model_parallel.tensor=4 = 4 "
                                                   r"devices per replica does not divide the 6"):
        make_plan(config(**{"model_parallel.tensor": 4, "data_parallel.mode": "mirrored"}), six)
    with pytest.raises(RuntimeMismatchError, match=r"tensor=4 = 8 devices per replica needs "
                                                   r"at least 8 devices"):
        make_plan(config(**{"model_parallel.tensor": 4, "model_parallel.stages": 2}), CPUS)


def test_multi_worker_tensor_groups_use_the_first_local_devices():
    workers = parse_tf_config(
        '{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 0}}'
    )
    plan = make_plan(config(**{"model_parallel.tensor": 2}), CPUS, workers)
    assert plan.mesh.devices == tuple(CPUS[:2]) and plan.mesh.group_devices(0, 0) == tuple(
        CPUS[:2])
    assert plan.num_replicas == 2


def test_mesh_refuses_devices_that_do_not_divide():
    with pytest.raises(RuntimeMismatchError, match="5 devices do not divide into stages=2"):
        DeviceMesh(tuple("abcde"), stages=2)


def test_tf_config_unset_or_without_cluster_is_single_process():
    assert parse_tf_config(None) is None
    assert parse_tf_config("") is None
    assert parse_tf_config('{"task": {}}') is None


def test_tf_config_chief_detection():
    text = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                       "task": {"type": "worker", "index": 0}})
    info = parse_tf_config(text)
    assert not info.is_chief and info.num_workers == 2
    no_chief = parse_tf_config(json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                           "task": {"type": "worker", "index": 0}}))
    assert no_chief.is_chief


@pytest.mark.parametrize(
    "value, match",
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('["a"]', "TF_CONFIG must be a JSON object"),
        ('{"cluster": {"wroker": ["a:1"]}, "task": {"type": "wroker", "index": 0}}',
         "unknown job type 'wroker'. Did you mean \"worker\""),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
         "task index 3 is out of range for job 'worker' with 1 task"),
        ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}',
         "lists 2 chiefs"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
         "task type 'ps' is not a job of the cluster"),
        ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}',
         "must be a list of 'host:port' strings"),
    ],
)
def test_bad_tf_config(value, match):
    with pytest.raises(ConfigError, match=match):
        parse_tf_config(value)


def test_slurm_step_resolves_through_tensorflows_resolver(monkeypatch):
    from hybridpar.topology.cluster import cluster_from_env

    for name, value in {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
                        "SLURM_STEP_NODELIST": "node[1-2]",
                        "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}.items():
        monkeypatch.setenv(name, value)
    # Set before deleting, so monkeypatch restores the original state afterwards:
    # cluster_from_env exports TF_CONFIG, which must not leak into later tests.
    monkeypatch.setenv("TF_CONFIG", "")
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cluster = cluster_from_env()
    assert dict(cluster.jobs) == {"worker": ("node1:8888", "node2:8888")}
    assert (cluster.task_type, cluster.task_index) == ("worker", 1)
    assert json.loads(os.environ["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


def test_single_task_slurm_step_is_no_cluster(monkeypatch):
    from hybridpar.topology.cluster import cluster_from_env

    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster_from_env() is None


def test_multi_worker_stages_use_the_first_local_devices():
    workers = parse_tf_config(
        '{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 0}}'
    )
    plan = make_plan(config(**{"model_parallel.stages": 2}), CPUS, workers)
    assert plan.mode == "multi_worker"
    assert plan.mesh.devices == tuple(CPUS[:2]) and plan.mesh.replicas == 1
    assert plan.num_replicas == 2


def test_multi_worker_stages_on_multi_gpu_workers_are_refused():
    workers = parse_tf_config(
        '{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 0}}'
    )
    gpus = ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1"]
    with pytest.raises(RuntimeMismatchError, match="makes every local GPU a replica"):
        make_plan(config(**{"model_parallel.stages": 2}), gpus, workers)


@pytest.mark.parametrize("key", ["model_parallel.stages", "model_parallel.microbatches",
                                 "model_parallel.tensor"])
def test_parameter_server_refuses_model_parallelism(key):
    ps = parse_tf_config(json.dumps({
        "cluster": {"chief": ["h:0"], "worker": ["h:1"], "ps": ["h:2"]},
        "task": {"type": "chief", "index": 0},
    }))
    with pytest.raises(ConfigError, match=r"mode='parameter_server' trains whole models.*"
                                          rf"{key.split('.')[1]}=2"):
        make_plan(config(**{key: 2}), CPUS, ps)


def evaluator_cluster(**jobs):
    cluster = {"chief": ["a:1"], "worker": ["b:1"], **jobs, "evaluator": ["e:1"]}
    return parse_tf_config(json.dumps({"cluster": cluster,
                                       "task": {"type": "evaluator", "index": 0}}))


@pytest.mark.parametrize("jobs, mode, cluster_mode", [
    ({"ps": ["c:1"]}, "auto", "parameter_server"),
    ({"ps": ["c:1"]}, "parameter_server", "parameter_server"),
    ({}, "multi_worker", "multi_worker"),
    ({}, "auto", "multi_worker"),
])
def test_the_evaluator_plans_a_local_layout(jobs, mode, cluster_mode):
    cfg = config(**{"data_parallel.mode": mode, "checkpoint.dir": "/ckpt"})
    plan = make_plan(cfg, CPUS, evaluator_cluster(**jobs))
    assert plan.evaluator and plan.cluster_mode == cluster_mode
    assert plan.mode == "mirrored" and plan.mesh.devices == tuple(CPUS)
    assert plan.num_workers == 1
    assert make_plan(cfg, CPUS[:1], evaluator_cluster(**jobs)).mode == "none"


def test_the_evaluator_keeps_model_parallel_stages_on_its_devices():
    cfg = config(**{"model_parallel.stages": 2, "checkpoint.dir": "/ckpt"})
    plan = make_plan(cfg, CPUS, evaluator_cluster())
    assert plan.mode == "mirrored" and plan.mesh.replicas == 2 and plan.mesh.stages == 2


def test_the_evaluator_needs_checkpoint_dir_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"Task evaluator:0 is the cluster's evaluator: it "
                                          r"evaluates the checkpoints the chief writes to "
                                          r"checkpoint.dir, but checkpoint.dir is not set"):
        make_plan(config(), CPUS, evaluator_cluster())


def test_the_evaluator_of_a_parameter_server_cluster_checks_that_cluster():
    cfg = config(**{"data_parallel.mode": "parameter_server", "checkpoint.dir": "/ckpt"})
    cluster = parse_tf_config(json.dumps({"cluster": {"chief": ["a:1"], "ps": ["c:1"],
                                                      "evaluator": ["e:1"]},
                                          "task": {"type": "evaluator", "index": 0}}))
    with pytest.raises(RuntimeMismatchError, match="needs a 'worker' job in TF_CONFIG"):
        make_plan(cfg, CPUS, cluster)


def test_nccl_needs_gpu_replicas_before_any_strategy_is_built():
    cfg = config(**{"data_parallel.mode": "mirrored", "communication.implementation": "nccl"})
    with pytest.raises(ConfigError, match=r"'nccl' needs GPU devices only, but the replicas "
                                          r"run on /device:CPU:0, /device:CPU:1"):
        make_plan(cfg, CPUS[:2])
    gpus = make_plan(cfg, GPUS)
    assert gpus.mesh.devices == ("/device:GPU:0", "/device:GPU:1")


def test_multi_worker_refuses_a_cluster_with_ps_tasks():
    ps = parse_tf_config(json.dumps({
        "cluster": {"chief": ["h:0"], "worker": ["h:1"], "ps": ["h:2"]},
        "task": {"type": "worker", "index": 0},
    }))
    with pytest.raises(ConfigError, match=r"mode='multi_worker' cannot use a cluster with 'ps' "
                                          r"tasks \(TF_CONFIG lists 1\)"):
        make_plan(config(**{"data_parallel.mode": "multi_worker"}), CPUS, ps)


@pytest.mark.parametrize("mode, resolved", [("auto", " (resolved from TF_CONFIG)"),
                                            ("parameter_server", "")])
def test_parameter_server_refuses_gradient_compression(mode, resolved):
    ps = parse_tf_config(json.dumps({
        "cluster": {"chief": ["h:0"], "worker": ["h:1"], "ps": ["h:2"]},
        "task": {"type": "chief", "index": 0},
    }))
    cfg = config(**{"data_parallel.mode": mode, "communication.compression": "fp16"})
    with pytest.raises(ConfigError, match=r"compression='fp16' compresses the synchronous .* "
                                          r"Received: data_parallel.mode='parameter_server'"
                                          + resolved.replace("(", r"\(").replace(")", r"\)")
                                          + r"\. Set"):
        make_plan(cfg, CPUS, ps)

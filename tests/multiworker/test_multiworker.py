"""Multi-worker training as users run it: real processes, TF_CONFIG, localhost.

Clusters are started with `hybridpar launch`; every worker runs the plain
`model.fit` script in scripts/train_digits.py.
"""

import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np
import portpicker
import pytest
from launch_helpers import launch_command

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("scripts") / "train_digits.py"
BIN = pathlib.Path(sys.executable).parent


def environment(**extra: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}
    env.pop("TF_CONFIG", None)
    return env


def launch(workers: int, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*launch_command(), "--workers", str(workers),
         "--timeout", str(timeout), "--", *command],
        capture_output=True, text=True, cwd=ROOT, env=environment(), timeout=timeout + 60,
    )


def train_digits(out: pathlib.Path, data_dir: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--out", str(out), "--data_dir", data_dir, *args]


def results(out: pathlib.Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def max_weight_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y))))
               for x, y in zip(a["weights"], b["weights"], strict=True))


def two_workers_and_one_device(tmp_path: pathlib.Path, script: str, *args: str,
                               cluster_only: Sequence[str] = (), cpus: int = 2
                               ) -> tuple[dict, dict]:
    """Runs ``scripts/<script> ARGS`` on 2 launched workers of ``cpus`` logical CPUs each
    (with ``cluster_only`` too) and alone on one device; checks both succeeded and the workers
    trained one replica each of a 2-replica multi_worker strategy.

    Returns:
        Each worker's results by task, and the one-device run's.
    """
    command = [sys.executable, str(SCRIPT.with_name(script)), *args]
    result = subprocess.run(
        [*launch_command(), "--workers", "2", "--timeout", "240", "--",
         *command, *cluster_only, "--out", str(tmp_path / "cluster")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env=environment(HYBRIDPAR_LOGICAL_CPUS=str(cpus)),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    single = subprocess.run([*command, "--out", str(tmp_path / "single")], capture_output=True,
                            text=True, env=environment(), timeout=300)
    assert single.returncode == 0, single.stderr[-4000:]
    workers = results(tmp_path / "cluster")
    assert [(w["mode"], w["num_replicas"]) for w in workers.values()] == [("multi_worker", 2)] * 2
    return workers, results(tmp_path / "single")["single"]


def test_two_workers_train_like_one_process(tmp_path, digits_data_dir):
    args = ("--shard_policy", "data", "--epochs", "2", "--shuffle")
    result = launch(2, *train_digits(tmp_path / "cluster", digits_data_dir, *args))
    assert result.returncode == 0, result.stderr[-4000:]
    single = subprocess.run(train_digits(tmp_path / "single", digits_data_dir, *args),
                            capture_output=True, text=True, env=environment(), timeout=300)
    assert single.returncode == 0, single.stderr[-4000:]

    workers = results(tmp_path / "cluster")
    reference = results(tmp_path / "single")["single"]
    assert set(workers) == {"worker-0", "worker-1"}
    assert [w["mode"] for w in workers.values()] == ["multi_worker", "multi_worker"]
    assert [w["num_replicas"] for w in workers.values()] == [2, 2]
    assert [w["is_chief"] for w in workers.values()] == [True, False]
    assert max_weight_diff(workers["worker-0"], workers["worker-1"]) == 0.0
    assert max_weight_diff(workers["worker-0"], reference) <= 1e-5
    np.testing.assert_allclose(workers["worker-0"]["history"]["loss"],
                               reference["history"]["loss"], rtol=1e-5)
    for worker in workers.values():  # evaluate and predict after fit, on every worker
        assert worker["predictions_shape"] == [100, 10]
        assert worker["evaluation"]["loss"] == pytest.approx(
            reference["evaluation"]["loss"], rel=1e-5)


def test_two_workers_with_xla_and_steps_per_execution_train_like_one_process(
    tmp_path, digits_data_dir
):
    """jit_compile=True and steps_per_execution=5 (1500 examples in batches of 64: 4
    executions of 5 batches, then one of 4 ending in a partial batch of 28) against one
    process without either."""
    args = ("--shard_policy", "data", "--epochs", "2")
    cluster = train_digits(tmp_path / "cluster", digits_data_dir, *args, "--jit_compile",
                           "--steps_per_execution", "5")
    result = launch(2, *cluster, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    single = subprocess.run(train_digits(tmp_path / "single", digits_data_dir, *args),
                            capture_output=True, text=True, env=environment(), timeout=300)
    assert single.returncode == 0, single.stderr[-4000:]
    workers, reference = results(tmp_path / "cluster"), results(tmp_path / "single")["single"]
    assert max_weight_diff(workers["worker-0"], workers["worker-1"]) == 0.0
    assert max_weight_diff(workers["worker-0"], reference) <= 1e-5
    np.testing.assert_allclose(workers["worker-0"]["history"]["loss"],
                               reference["history"]["loss"], rtol=1e-5)
    counts = sum(np.array(w["counts"]) for w in workers.values())
    assert counts[:1500].tolist() == [2] * 1500  # every train example once per epoch
    assert counts.sum() == 3000


@pytest.mark.parametrize("policy", ["data", "file"])
def test_every_example_is_trained_on_exactly_once_per_epoch(policy, tmp_path, digits_data_dir):
    result = launch(2, *train_digits(tmp_path, digits_data_dir, "--shard_policy", policy))
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"sharding the input by {policy.upper()} over 2 workers" in result.stderr
    counts = sum(np.array(r["counts"]) for r in results(tmp_path).values())
    train_ids = np.arange(1500)  # hybridpar_digits: ids 0..1499 are the train split
    assert counts[train_ids].tolist() == [1] * 1500
    assert counts.sum() == 1500


def test_auto_policy_picks_file_for_sharded_tfds(tmp_path, digits_data_dir):
    result = launch(2, *train_digits(tmp_path, digits_data_dir))
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("sharding the input by FILE over 2 workers (file-based input with 8 files >= 2 "
            "workers)") in result.stderr
    assert result.stderr.count("sharding the input by") == 2  # once per worker, not per step


def test_multi_worker_preset_through_launch(tmp_path, digits_data_dir):
    model_dir, checkpoints, logs = tmp_path / "model", tmp_path / "checkpoints", tmp_path / "logs"
    command = [str(BIN / "hybridpar"), "train", "--config", "configs/multi_worker.yaml",
               "--model_dir", str(model_dir), "--data_dir", digits_data_dir,
               "--set", f"checkpoint.dir={checkpoints}", "--set", "train.epochs=2"]
    result = subprocess.run(  # the default console, as a person runs it
        [sys.executable, "-m", "hybridpar.launch", "--workers", "2", "--timeout", "120",
         "--log-dir", str(logs), "--", *command],
        capture_output=True, text=True, cwd=ROOT, env=environment(), timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["mode"] == "multi_worker" and summary["num_replicas"] == 2
    assert (model_dir / "model.keras").exists()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000024", "ckpt-00000048"]
    # The console: the chief's progress bars, one line per epoch off a terminal, one summary.
    assert result.stdout.count("hybridpar training summary") == 1
    assert "[worker:0] hybridpar training summary" in result.stdout
    assert "[worker:1]" not in result.stdout and "\r" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) < 400
    epochs = [line for line in result.stdout.splitlines()
              if line.startswith("[worker:0] 24/24 ")]
    assert len(epochs) == 2, result.stdout
    # worker:1 trained too (its full log says so) and printed no summary.
    worker_1 = (logs / "worker-1.log").read_text()
    assert "24/24 " in worker_1 and "hybridpar training summary" not in worker_1


@pytest.mark.parametrize(
    "variant, failure",
    [
        ("unbuilt", "Attempt to convert a value ({'x': PerReplica"),
        ("built", "Invalid reduction dimension 0 for input with 0 dimensions"),
    ],
)
def test_upstream_fit_fails_under_multi_worker(variant, failure, tmp_path):
    script = SCRIPT.with_name("upstream_fit.py")
    result = launch(2, sys.executable, str(script), variant)
    assert result.returncode != 0
    assert failure in result.stdout + result.stderr


def test_upstream_keras_callbacks_write_from_every_worker(tmp_path):
    script = SCRIPT.with_name("upstream_callbacks.py")
    result = launch(2, sys.executable, str(script), str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    assert len(list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))) == 2
    assert len(list(tmp_path.glob("log-*.csv"))) == 2


def test_keras_file_callbacks_write_from_the_chief_only(tmp_path, digits_data_dir):
    files = tmp_path / "files"
    result = launch(2, *train_digits(tmp_path / "out", digits_data_dir, "--epochs", "2",
                                     "--callbacks_dir", str(files)))
    assert result.returncode == 0, result.stderr[-4000:]
    assert len(list((files / "tensorboard" / "train").glob("events.out.tfevents.*"))) == 1
    assert len((files / "log.csv").read_text().splitlines()) == 3  # header + 2 epochs, once
    assert (files / "model.weights.h5").exists()
    assert sorted(p.name for p in (files / "backup").iterdir()) == [
        "latest.weights.h5", "training_metadata.json"]


def test_a_failed_worker_stops_the_cluster(tmp_path, digits_data_dir):
    started = time.monotonic()
    result = launch(2, *train_digits(tmp_path, digits_data_dir, "--epochs", "50",
                                     "--fail_task", "worker:1", "--fail_epoch", "1"))
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr[-4000:]
    assert "worker:1 fails at epoch 1" in result.stdout
    assert elapsed < 60  # start-up and one epoch, then stopped within seconds


def test_a_dead_peer_raises_instead_of_hanging(tmp_path, digits_data_dir):
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(subprocess.Popen(
            train_digits(tmp_path, digits_data_dir, "--epochs", "50", "--timeout", "10",
                         "--fail_task", "worker:1", "--fail_epoch", "1", "--fail_signal"),
            env={**environment(HYBRIDPAR_TASK=f"worker:{index}"), "TF_CONFIG": tf_config},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        _, stderr = processes[0].communicate(timeout=120)
    finally:
        for process in processes:
            process.kill()
    assert processes[0].returncode != 0
    # Whichever fires first: the coordination service's heartbeat check names
    # the dead task; the collective timeout (10 s here) says it timed out.
    assert ("unhealthy" in stderr and "task:1" in stderr) or "timed out" in stderr.lower()


def run_python(code: str, tf_config: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environment(), "TF_CONFIG": tf_config}, timeout=120)


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
         '"task": {"type": "worker", "index": 2}}', "task index 2 is out of range"),
        ('{"cluster": {"wrker": ["localhost:1"]}, "task": {"type": "wrker", "index": 0}}',
         'unknown job type \'wrker\'. Did you mean "worker"?'),
    ],
)
def test_bad_tf_config_fails_at_import(tf_config, message):
    started = time.monotonic()
    result = run_python("import hybridpar", tf_config)
    assert result.returncode != 0
    assert message in result.stderr
    assert time.monotonic() - started < 30


def test_multi_worker_mode_refuses_a_cluster_with_ps():
    tf_config = json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"],
                                        "ps": ["localhost:3"]},
                            "task": {"type": "chief", "index": 0}})
    code = ("import hybridpar\n"
            "with hybridpar.scope({'data_parallel': {'mode': 'multi_worker'}}):\n    pass\n")
    result = run_python(code, tf_config)
    assert result.returncode != 0
    assert "mode='multi_worker' cannot use a cluster with 'ps' tasks" in result.stderr


def test_workers_given_different_cluster_specs_fail_fast(tmp_path):
    ports = [portpicker.pick_unused_port() for _ in range(3)]
    workers = [f"localhost:{p}" for p in ports[:2]]
    specs = [{"worker": workers}, {"worker": workers, "evaluator": [f"localhost:{ports[2]}"]}]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", "import hybridpar"],
            env={**environment(), "TF_CONFIG": json.dumps(
                {"cluster": specs[i], "task": {"type": "worker", "index": i}})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=120)[1] for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert all(p.returncode != 0 for p in processes)
    assert all("TF_CONFIG cluster specs differ between tasks" in err for err in outputs)


@pytest.mark.parametrize("schedule, shard", [("gpipe", False), ("1f1b", False), ("1f1b", True)])
def test_hybrid_2_workers_x_2_stages_pipelined_trains_like_one_device(
    schedule, shard, tmp_path, digits_data_dir
):
    workers, reference = two_workers_and_one_device(
        tmp_path, "train_hybrid.py", "--data_dir", digits_data_dir, "--schedule", schedule,
        cluster_only=["--shard"] if shard else [])
    for worker in workers.values():
        for path, devices in worker["devices"].items():
            on_stage_1 = path.split("/")[-1].startswith(("block_1", "head")) or path.startswith(
                ("block_1/", "head"))
            assert devices == (["CPU:1"] if on_stage_1 else ["CPU:0"]), path
    assert max_weight_diff(workers["worker-0"], workers["worker-1"]) == 0.0
    assert max_weight_diff(workers["worker-0"], reference) <= 1e-5
    for worker in workers.values():
        # each worker's slots of its shards of a stage's buckets sit on that stage's CPU; no
        # variable holds a copy of the shards themselves
        slots = worker["slot_devices"]
        assert sorted(set(map(tuple, slots.values()))) == (
            [("CPU:0",), ("CPU:1",)] if shard else [])
        assert worker["shard_variables"] == []


@pytest.mark.parametrize("backbone, stages", [
    ("GPT2Backbone", False), ("GPT2Backbone", True), ("LlamaBackbone", False)],
    ids=["gpt2", "gpt2_stages_1f1b", "llama"])
def test_2_workers_of_2_shards_train_like_one_device(backbone, stages, tmp_path):
    pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    workers, reference = two_workers_and_one_device(
        tmp_path, "train_tensor.py", "--backbone", backbone,
        cluster_only=["--stages"] if stages else [], cpus=4 if stages else 2)
    for worker in workers.values():
        shards = worker["shards"]
        assert shards["transformer_layer_0/feedforward_intermediate_dense/kernel"] == [
            "CPU:0", "CPU:1"]
        assert shards["transformer_layer_1/feedforward_intermediate_dense/kernel"] == (
            ["CPU:2", "CPU:3"] if stages else ["CPU:0", "CPU:1"])
    assert max_weight_diff(workers["worker-0"], workers["worker-1"]) == 0.0
    assert max_weight_diff(workers["worker-0"], reference) <= 1e-5
    assert workers["worker-0"]["loss"] == pytest.approx(reference["loss"], rel=1e-5)

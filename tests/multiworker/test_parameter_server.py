"""Parameter-server training as users run it: `hybridpar launch --workers N --ps M`.

Every task runs the same plain `model.fit` script (scripts/train_ps.py); the
worker and ps tasks serve from `hybridpar.scope()`, the chief trains the
wide-and-deep recommender and writes what it saw to ``chief-<restart>.json``.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest
from launch_helpers import launch_command

import hybridpar

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = pathlib.Path(__file__).with_name("scripts")
BIN = pathlib.Path(sys.executable).parent


def launch(workers: int, ps: int, *command: str, max_restarts: int = 0,
           timeout: float = 180, evaluator: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [*launch_command(), "--workers", str(workers), "--ps", str(ps),
         *(["--evaluator"] if evaluator else []), "--max-restarts", str(max_restarts),
         "--timeout", str(timeout), "--", *command],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout + 60,
    )


def train_ps(out: pathlib.Path, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / "train_ps.py"), "--out", str(out), *args]


def chief(out: pathlib.Path, restart: int = 0) -> dict:
    return json.loads((out / f"chief-{restart}.json").read_text())


def ps_device(index: int) -> str:
    return f"/job:ps/replica:0/task:{index}/device:CPU:0"


@pytest.fixture(scope="module")
def clicks_data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tfds data dir holding the locally generated hybridpar_clicks set, built once."""
    data_dir = tmp_path_factory.mktemp("tfds")
    hybridpar.data.load_tfds("hybridpar_clicks", "train", data_dir)
    return str(data_dir)


def test_recommender_trains_with_its_embedding_sharded_over_both_ps(tmp_path):
    result = launch(2, 2, *train_ps(tmp_path, "--input", "fn"))
    assert result.returncode == 0, result.stderr[-4000:]
    run = chief(tmp_path)
    assert run["mode"] == "parameter_server"
    assert run["iterations"] == 40 and sum(run["steps_by_worker"]) == 40  # 2 epochs x 20
    assert {k: len(v) for k, v in run["history"].items()} == {
        "accuracy": 2, "loss": 2, "val_accuracy": 2, "val_loss": 2}
    assert set(run["evaluation"]) == {"accuracy", "loss"}
    assert run["predictions_shape"] == [100, 2]
    assert run["table_type"] == "ShardedVariable"
    shards = run["table_shards"]
    assert sorted(device for device, _ in shards) == [ps_device(0), ps_device(1)]
    assert [shape for _, shape in shards] == [[2000, 16], [2000, 16]]
    # Adam's two slots per shard, each on its shard's ps, each the shard's size.
    assert sorted(map(tuple, (map(str, s) for s in run["slots"]))) == sorted(
        (device, str(shape)) for device, shape in shards for _ in range(2))
    assert "[chief:0] Epoch 2/2" in result.stdout and "[chief:0] 20/20 - " in result.stdout
    for task in ("worker:0", "worker:1", "ps:0", "ps:1"):
        assert f"[{task}] hybridpar: {task} serving the parameter-server cluster" in result.stderr
        assert f"[{task}] Epoch" not in result.stdout  # only the chief trains and reports


def test_a_dataset_is_read_by_every_worker_and_arrays_validate(tmp_path):
    args = ("--input", "dataset", "--epochs", "1", "--validation", "arrays")
    result = launch(1, 2, *train_ps(tmp_path, *args))
    assert result.returncode == 0, result.stderr[-4000:]
    run = chief(tmp_path)
    assert run["iterations"] == 20 and run["steps_by_worker"] == [20]
    assert run["history"]["loss"][0] > 0
    # validation_data=(x, y) arrays, validated at the epoch's end on the final weights
    for name in ("loss", "accuracy"):
        assert run["history"][f"val_{name}"] == [
            pytest.approx(run["val_evaluation"][name], rel=1e-5)]


@pytest.mark.parametrize("args, message", [
    (["--input", "generator"], r"cannot send this tf.data.Dataset to the workers: it runs "
                               r"Python code \((Eager)?PyFunc"),
    (["--no_steps_per_epoch"], r"needs steps_per_epoch \(a positive int\).*Received: "
                               r"steps_per_epoch=None"),
    (["--input", "arrays"], r"needs a tf.data.Dataset or a function `dataset_fn\(input_context\)"
                            r" -> tf.data.Dataset`.*Received: ndarray"),
])
def test_bad_input_fails_before_training_with_a_clear_error(args, message, tmp_path):
    result = launch(1, 1, *train_ps(tmp_path, "--shards", "1", *args))
    assert result.returncode == 1
    assert "hybridpar.errors.ConfigError" in result.stderr
    assert re.search(message, result.stderr), result.stderr[-3000:]
    assert "Epoch 1/" not in result.stdout


def test_upstream_keras_fit_fails_under_parameter_server_strategy():
    result = launch(1, 1, sys.executable, str(SCRIPTS / "upstream_ps_fit.py"))
    assert result.returncode == 1
    assert ("ValueError: To use this dataset, you need to pass this dataset to "
            "ClusterCoordinator.create_per_worker_dataset") in result.stderr


def test_a_killed_worker_loses_no_steps(tmp_path):
    args = ("--epochs", "3", "--steps", "40", "--kill", "worker:1", "--kill_at", "50")
    result = launch(2, 2, *train_ps(tmp_path, *args))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "[chief:0] killing worker:1" in result.stdout
    assert "task worker:1 exited with 137 (killed by SIGKILL)" not in result.stderr  # no restart
    run = chief(tmp_path)
    # No step is lost. A step whose update reached the ps just before its worker died is
    # run again elsewhere (the coordinator retries a closure that returned no result), so
    # the one step worker:1 had in flight may count twice.
    assert run["iterations"] in (120, 121)
    assert run["steps_by_worker"][0] > run["steps_by_worker"][1]
    assert len(run["history"]["loss"]) == 3


def test_a_restarted_worker_rejoins(tmp_path):
    args = ("--epochs", "4", "--steps", "40", "--kill", "worker:1", "--kill_at", "10",
            "--await_restart")
    result = launch(2, 2, *train_ps(tmp_path, *args), max_restarts=1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("task worker:1 exited with 137 (killed by SIGKILL); restarting it alone at the same "
            "address (restart 1 of 1)") in result.stderr
    assert result.stderr.count("[worker:1] hybridpar: worker:1 serving") == 2
    run = chief(tmp_path)
    assert run["iterations"] in (160, 161)  # none lost; the in-flight step may run twice
    after_restart = run["steps_by_worker_at_epoch_begin"][1]  # counted once it served again
    assert run["steps_by_worker"][1] > after_restart[1]  # the new worker:1 ran steps


def test_a_lost_ps_is_named_and_a_relaunch_resumes_from_the_checkpoint(tmp_path):
    args = ("--epochs", "3", "--steps", "40", "--kill", "ps:1", "--kill_at", "40",
            "--kill_at_epoch_start",
            "--checkpoint_dir", str(tmp_path / "checkpoints"))
    result = launch(2, 2, *train_ps(tmp_path, *args), max_restarts=1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("hybridpar.errors.ParameterServerUnavailableError: Parameter server ps:1 "
            "(127.0.0.1:") in result.stderr, result.stderr[:8000]
    assert "became unavailable during training" in result.stderr
    assert "task chief:0 exited with 1; restarting the cluster (restart 1 of 1)" in result.stderr
    assert not (tmp_path / "chief-0.json").exists()
    resumed = chief(tmp_path, restart=1)
    assert resumed["epochs_run"] == [1, 2]  # epoch 0 came from the checkpoint
    assert resumed["iterations"] == 120  # optimizer state restored with it
    assert sum(resumed["steps_by_worker"]) == 80


def test_parameter_server_preset_through_launch(tmp_path, clicks_data_dir, tensorboard_scalars):
    model_dir, checkpoints = tmp_path / "model", tmp_path / "checkpoints"
    result = launch(2, 2, str(BIN / "hybridpar"), "train", "--config",
                    "configs/parameter_server.yaml", "--model_dir", str(model_dir),
                    "--data_dir", clicks_data_dir, "--set", f"checkpoint.dir={checkpoints}",
                    "--set", "train.epochs=2", "--verbose", "2", evaluator=True)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["mode"] == "parameter_server"
    assert summary["eval_metrics"]["accuracy"] > 0.6  # the majority class is 0.5
    assert [p.name for p in hybridpar.checkpoint.list_checkpoints(checkpoints)] == [
        "ckpt-00000060", "ckpt-00000120"]  # one per epoch, written by the chief
    # The same command on the evaluator task evaluated both, beside the chief's logs.
    evaluated = json.loads((model_dir / "evaluator" / "summary.json").read_text())
    assert evaluated["eval_metrics"] == pytest.approx(summary["eval_metrics"], rel=1e-5)
    assert set(tensorboard_scalars(model_dir / "logs" / "evaluation")) == {60, 120}
    reloaded = keras.models.load_model(model_dir / "model.keras")
    assert reloaded.get_layer("item_embedding").embeddings.shape == (100_000, 16)


def test_a_checkpoint_of_two_ps_resumes_on_three_each_ps_writing_its_shards(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    args = ("--steps", "20", "--checkpoint_dir", str(checkpoints))
    first = launch(1, 2, *train_ps(tmp_path / "two", "--epochs", "1", *args))
    assert first.returncode == 0, first.stderr[-4000:]
    assert "did not hash the checkpoint files it wrote" not in first.stderr
    (written,) = hybridpar.checkpoint.list_checkpoints(checkpoints)
    manifest = json.loads((written / "manifest.json").read_text())
    # One data file per task holding variables, hashed by the task that wrote it.
    tasks = {name: entry["task"] for name, entry in manifest["files"].items()}
    assert tasks.pop("state.index") == "chief:0"  # the chief merged the index
    data_files = sorted(tasks)
    assert {tasks[name] for name in data_files[-2:]} == {"ps:0", "ps:1"}
    assert len(set(tasks.values())) == len(tasks)  # one data file per task
    # The table and its Adam slots are one logical tensor each, whatever the shards.
    specs = {v["path"]: v["shape"] for group in ("model", "optimizer")
             for v in manifest["variables"][group]}
    assert [shape for path, shape in specs.items() if "item_embedding" in path] == [
        [4000, 16]] * 3
    resumed = launch(1, 3, *train_ps(tmp_path / "three", "--epochs", "2", "--shards", "3",
                                     *args))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    run = chief(tmp_path / "three")
    assert run["epochs_run"] == [1] and run["iterations"] == 40  # the optimizer step restored
    assert sorted(shape[0] for _, shape in run["table_shards"]) == [1333, 1333, 1334]
    assert "variables on 2 parameter server(s), resumed on" in resumed.stderr

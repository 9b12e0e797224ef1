"""The model zoo on real clusters: 2 workers (multi_worker) and 1 worker with 2 parameter
servers, every task running zoo_cluster_task.py through ``hybridpar launch``.

Multi-worker: MobileNetV2, keras_hub's BERT classifier and GPT-2 causal LM (a
per-token loss with temporal sample weights) on 33 examples in batches of 16 (the
final batch of 1 leaves one of the 2 replicas padded), each fed by numpy and by
``tf.data``, and one epoch of an
MLP under each mixed-precision policy, and a CNN on record files that the workers'
file shards end unevenly. Parameter servers: a BERT classifier whose 20,000-row token
embedding is sharded over both ps, and the same mixed-precision MLP.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import model_checks
import pytest
import zoo_cluster_task  # beside this file
from launch_helpers import launch_command

pytestmark = [pytest.mark.zoo, pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = pathlib.Path(__file__).with_name("zoo_cluster_task.py")
TOLERANCE = 1e-5


def launch(out: pathlib.Path, *flags: str, task_args: tuple[str, ...],
           timeout: float = 600) -> dict[str, dict]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    completed = subprocess.run(
        [*launch_command(), *flags, "--timeout", str(timeout), "--",
         os.sys.executable, str(TASK), "--out", str(out), *task_args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout + 60,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def assert_row(name: str, row: dict, record_property, mode: str) -> None:
    assert row["predict_rows"] == 33  # exactly the input's rows
    assert row["predict"] <= TOLERANCE, (name, row)
    assert row["evaluate"] <= TOLERANCE, (name, row)  # relative beyond 1
    if "reloaded" in row:
        assert row["reloaded"] <= TOLERANCE, (name, row)
    if "weights" in row:
        assert row["weights"] <= TOLERANCE, (name, row)
    else:
        assert row["batch_norm_finite"], name
    record_property("zoo", {"model": name, "mode": mode,
                            **{k: row[k] for k in ("weights", "predict", "evaluate") if k in row}})


def assert_mixed(mixed: dict, record_property, mode: str) -> None:
    assert set(mixed) == {"mixed_float16", "mixed_bfloat16"}
    for policy, units in mixed.items():
        assert units <= model_checks.MIXED_TOLERANCE_UNITS, (policy, units)
        record_property("zoo", {"model": f"MLP {policy}", "mode": mode,
                                "update / roundoff": units})


# Each model fed both ways: numpy arrays and tf.data with a final batch of 1 (one of the
# 2 replicas padded). Parameter servers take a dataset (Keras's ClusterCoordinator).
TWO_WORKER_ROWS = [f"{name}:{feed}" for name in ("MobileNetV2", "BertTextClassifier",
                                                 "GPT2CausalLM") for feed in ("numpy", "tf.data")]


@pytest.mark.zoo_heavy  # about 5 minutes: make test-zoo-heavy runs it
def test_zoo_on_two_workers(tmp_path, record_property):
    files = tmp_path / "files"
    files.mkdir()
    zoo_cluster_task.write_uneven_files(files)
    reports = launch(tmp_path / "out", "--workers", "2",
                     task_args=("--models", ",".join(TWO_WORKER_ROWS), "--mixed",
                                "--uneven_files", str(files)))
    assert set(reports) == {"worker-0", "worker-1"}
    assert [r["mode"] for r in reports.values()] == ["multi_worker"] * 2
    assert [r["num_replicas"] for r in reports.values()] == [2, 2]
    first, second = reports["worker-0"], reports["worker-1"]
    assert list(first["models"]) == TWO_WORKER_ROWS
    for name, row in first["models"].items():
        other = second["models"][name]
        assert row["weights_sum"] == other["weights_sum"], name  # one model on both workers
        assert row["loss"] == other["loss"], name
        assert_row(name, row, record_property, "2 workers")
    assert_mixed(first["mixed"], record_property, "2 workers")
    # File sharding: worker 0 reads 20 images (batches 8, 8, 4: 6 pieces), worker 1 reads
    # 4 (2 pieces); for the last 4 steps TensorFlow hands worker 1's replica an empty batch,
    # which fails in batch norm's oneDNN kernel unless it becomes a zero example of weight
    # 0. The optimizer counts the 6 steps that had data: the step that meets the end of
    # data of unknown length changes nothing (end_of_data_step).
    uneven = first["uneven_files"]
    assert uneven == second["uneven_files"]
    assert uneven["steps"] == 6 and uneven["batch_norm_finite"], uneven


def test_zoo_with_parameter_servers(tmp_path, record_property):
    reports = launch(tmp_path / "out", "--workers", "1", "--ps", "2",
                     task_args=("--models", "BertWideVocabulary:tf.data", "--mixed",
                                "--partitioner_shards", "2"))
    chief = reports["chief-0"]
    assert chief["mode"] == "parameter_server"
    row = chief["models"]["BertWideVocabulary:tf.data"]
    embedding = [devices for path, devices in row["sharded"].items() if "token_embedding" in path]
    assert embedding == [["/job:ps/replica:0/task:0/device:CPU:0",
                          "/job:ps/replica:0/task:1/device:CPU:0"]], row["sharded"]
    assert_row("BertWideVocabulary", row, record_property, "parameter servers")
    assert_mixed(chief["mixed"], record_property, "parameter servers")

"""ZeRO stage 1 (shard_optimizer_state) on a real 2-worker cluster through `hybridpar launch`.

scripts/train_checkpoint.py --shard: a 12-32-2 MLP (482 weights), Adam, 45 optimizer steps.
Each worker holds only its replica's shards and writes them into the checkpoint itself.
"""

import json

import pytest
import tensorflow as tf
from test_checkpoint import (  # noqa: F401  (reference is a fixture)
    STEPS,
    launch,
    max_weight_diff,
    reference,
    result,
    script,
    single,
)

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]


def test_two_sharded_workers_train_to_the_single_process_weights(tmp_path, reference):  # noqa: F811
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--shard"))
    assert run.returncode == 0, run.stderr[-4000:]
    chief = result(tmp_path / "out" / "worker-0-run0.json")
    other = result(tmp_path / "out" / "worker-1-run0.json")
    assert chief["mode"] == "multi_worker" and chief["num_replicas"] == 2
    assert chief["steps"] == STEPS
    assert max_weight_diff(chief, other) == 0.0
    assert max_weight_diff(chief, reference) <= 1e-5  # measured 1.5e-7
    # Adam's two slots: 2 x 482 x 4 B in one process, 2 x 241 x 4 B per worker sharded
    # (12 B of scalars per optimizer on top: the outer one's, and the replica optimizer's)
    assert list(reference["optimizer_bytes"].values()) == [2 * 482 * 4 + 12]
    for task, outcome in enumerate((chief, other)):
        assert outcome["optimizer_bytes"] == {
            f"/job:worker/task:{task}/device:CPU:0": 2 * 241 * 4 + 12 + 12}
    output = run.stdout + run.stderr
    assert output.count("optimizer state sharded over 2 replicas: 4 variable(s), 482 "
                        "elements in 1 bucket(s); 241 to 241 elements per replica") == 2


@pytest.mark.parametrize("optimizer", ["adamw", "sgd_momentum"])
def test_two_sharded_workers_train_other_optimizers_to_the_single_process_weights(
        optimizer, tmp_path):
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--shard", "--optimizer",
                        optimizer))
    assert run.returncode == 0, run.stderr[-4000:]
    alone = single(script(tmp_path / "single", tmp_path / "single-ckpt", "--optimizer",
                          optimizer))
    assert alone.returncode == 0, alone.stderr[-4000:]
    reference_run = result(tmp_path / "single" / "single-run0.json")
    chief = result(tmp_path / "out" / "worker-0-run0.json")
    assert chief["num_replicas"] == 2 and chief["steps"] == STEPS
    assert max_weight_diff(chief, result(tmp_path / "out" / "worker-1-run0.json")) == 0.0
    assert max_weight_diff(chief, reference_run) <= 1e-5


def test_a_killed_sharded_worker_resumes_with_every_workers_optimizer_shards(
        tmp_path, reference):  # noqa: F811
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--shard", "--die_at", "23",
                        "--die_signal", "KILL"), max_restarts=1)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "task worker:1 exited with 137; restarting the cluster" in run.stderr
    for task in ("worker-0", "worker-1"):
        resumed = result(tmp_path / "out" / f"{task}-run1.json")
        assert resumed["restored_step"] == 20 and resumed["steps"] == STEPS
        # the resumed Adam continues from both workers' restored moments
        assert max_weight_diff(resumed, reference) <= 1e-5
    # every worker's slices merged into the checkpoint, no worker's bundle left beside it
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "ckpt-00000030", "ckpt-00000040", "ckpt-00000045"]
    latest = tmp_path / "ckpt" / "ckpt-00000045"
    manifest = json.loads((latest / "manifest.json").read_text())
    assert {name: entry["task"] for name, entry in manifest["files"].items()
            if name.startswith("state.data")} == {
        "state.data-00000-of-00002": "worker:0", "state.data-00001-of-00002": "worker:1"}
    slots = tf.train.load_checkpoint(str(latest / "state"))
    assert slots.get_tensor("optimizer/00002").shape == (12, 32)  # whole, from both workers



def test_a_sharded_worker_without_the_checkpoint_callback_is_named_at_the_first_save(tmp_path):
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--shard",
                        "--no_callbacks_on", "worker:1"))
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "worker 1 trains without hybridpar's checkpoint callback" in output
    assert "callbacks=hs.callbacks()" in output
    # the chief refused before writing: no checkpoint, not even a partial one
    assert not [p.name for p in (tmp_path / "ckpt").iterdir() if "ckpt-" in p.name]

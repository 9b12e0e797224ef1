"""Sidecar evaluation and parameter-server preemption with real processes (`hybridpar launch`).

The same plain ``model.fit`` script runs on every task: scripts/train_ps.py
(chief + workers + ps) and scripts/train_checkpoint.py (multi-worker). On the
evaluator task its ``fit`` evaluates every checkpoint the chief writes.
"""

import json
import pathlib
import re
import sys

import pytest
from test_parameter_server import SCRIPTS, chief, launch, train_ps

import hybridpar

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

TRAIN_CHECKPOINT = SCRIPTS / "train_checkpoint.py"


def read(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def seen_after(stderr: str) -> list[float]:
    """How long after each save the evaluator read the checkpoint (its log lines)."""
    return [float(s) for s in re.findall(r"read (\d+\.\d) s after the chief saved it", stderr)]


def test_upstream_parameter_server_strategy_hangs_on_an_evaluator_without_a_server():
    result = launch(1, 1, sys.executable, str(SCRIPTS / "upstream_ps_evaluator.py"),
                    evaluator=True)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(re.search(r"\[chief:0\] (\{.*\})", result.stdout)[1])
    assert not outcome["connected"]  # without the evaluator job it connects at once


def test_the_evaluator_of_a_parameter_server_cluster_evaluates_every_epoch(
    tmp_path, tensorboard_scalars
):
    checkpoints = tmp_path / "ckpt"
    result = launch(2, 1, *train_ps(tmp_path, "--shards", "1", "--epochs", "3",
                                    "--checkpoint_dir", str(checkpoints)), evaluator=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "task chief:0 exited with 0; evaluator:0 exited with 0" in result.stderr
    assert "[evaluator:0] hybridpar: mode=none" in result.stderr
    assert "[evaluator:0] hybridpar: evaluator:0 serving" not in result.stderr
    assert "[evaluator:0] Epoch" not in result.stdout  # it trains nothing
    trained, evaluated = chief(tmp_path), read(tmp_path / "evaluator-0.json")
    assert [p.name for p in hybridpar.checkpoint.list_checkpoints(checkpoints)] == [
        "ckpt-00000020", "ckpt-00000040", "ckpt-00000060"]
    assert evaluated["history"]["step"] == [20, 40, 60]  # every epoch's checkpoint
    assert evaluated["epochs"] == [0, 1, 2] == trained["epochs_run"]
    for name in ("loss", "accuracy"):  # what the chief validated on at each epoch's end
        assert evaluated["history"][f"val_{name}"] == pytest.approx(
            trained["history"][f"val_{name}"], rel=1e-5)
        # the last figures are the chief's evaluate() of the final model
        assert evaluated["history"][f"val_{name}"][-1] == pytest.approx(
            trained["val_evaluation"][name], rel=1e-5)
        assert evaluated["evaluation"][name] == pytest.approx(trained["val_evaluation"][name],
                                                              rel=1e-5)
    assert set(tensorboard_scalars(checkpoints / "evaluator")) == {20, 40, 60}
    assert len(seen_after(result.stderr)) == 3
    print("evaluator read each checkpoint after (s):", seen_after(result.stderr))


def test_the_evaluator_of_a_multi_worker_cluster(tmp_path, tensorboard_scalars):
    out, checkpoints = tmp_path / "out", tmp_path / "ckpt"
    command = [sys.executable, str(TRAIN_CHECKPOINT), "--out", str(out), "--ckpt",
               str(checkpoints), "--validate", "--every_steps", "100"]
    result = launch(2, 0, *command, evaluator=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("all 2 training task(s) exited with 0 (the last was worker:") in result.stderr
    assert "evaluator:0 exited with 0; exit code 0" in result.stderr
    workers, evaluated = read(out / "worker-0-run0.json"), read(out / "evaluator-0-run0.json")
    assert workers["mode"] == "multi_worker" and evaluated["mode"] == "none"
    assert evaluated["is_evaluator"] and evaluated["steps"] == 0  # restores weights, trains not
    assert evaluated["history"]["step"] == [15, 30, 45]
    for name in ("loss", "accuracy"):
        assert evaluated["history"][f"val_{name}"] == pytest.approx(
            workers["history"][f"val_{name}"], rel=1e-5)
        assert evaluated["evaluation"][name] == pytest.approx(workers["evaluation"][name],
                                                              rel=1e-5)
    assert set(tensorboard_scalars(checkpoints / "evaluator")) == {15, 30, 45}
    assert read(checkpoints / "training-end.json")["step"] == 45
    print("evaluator read each checkpoint after (s):", seen_after(result.stderr))


def test_sigterm_on_the_parameter_server_chief_saves_its_step_and_the_relaunch_resumes_there(
    tmp_path,
):
    checkpoints = tmp_path / "ckpt"
    args = ("--epochs", "2", "--steps", "20", "--term_at", "30", "--shards", "1",
            "--checkpoint_dir", str(checkpoints))
    result = launch(2, 1, *train_ps(tmp_path, *args), max_restarts=1)
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("[chief:0] hybridpar: received SIGTERM; scheduling no more steps, joining those in "
            "flight, then saving and exiting with 42.") in result.stderr
    assert ("task chief:0 exited with 42 (preempted, saved a checkpoint); restarting the "
            "cluster (restart 1 of 1)") in result.stderr
    assert not (tmp_path / "chief-0.json").exists()
    manifest = read(checkpoints / "ckpt-00000030" / "manifest.json")
    assert manifest["reason"] == "preemption"
    # The signal came after step 30 was scheduled; no step after it was, all 30 were joined.
    assert manifest["step"] == 30
    assert manifest["data"] == {"epoch": 1, "batch": 10, "iterator_position": 10,
                                "iterator_persists": False, "steps_per_epoch": 20}
    assert ("[chief:0] hybridpar: resumed from " + str(checkpoints / "ckpt-00000030") +
            " at optimizer step 30, inside epoch 2, after its first 10 step(s)") in result.stderr
    resumed = chief(tmp_path, restart=1)
    assert resumed["epochs_run"] == [1]
    assert sum(resumed["steps_by_worker"]) == 10  # only the epoch's remaining steps ran
    # The scheduled 40 steps; a step whose worker failed may run twice (at least once).
    assert resumed["iterations"] in (40, 41)

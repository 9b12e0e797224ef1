"""Checkpoints that survive, with real processes: SIGKILL and SIGTERM through `hybridpar launch`.

Every run trains scripts/train_checkpoint.py for 3 epochs of 15 global batches (45
optimizer steps) and is compared with one uninterrupted single-process run.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from launch_helpers import launch_command

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("scripts") / "train_checkpoint.py"
STEPS = 45


def environment() -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return env


def script(out: pathlib.Path, ckpt: pathlib.Path, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--out", str(out), "--ckpt", str(ckpt), *args]


def launch(command: list[str], max_restarts: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*launch_command(), "--workers", "2", "--max-restarts",
         str(max_restarts), "--grace", "2", "--timeout", "240", "--", *command],
        capture_output=True, text=True, cwd=ROOT, env=environment(), timeout=300,
    )


def single(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment(),
                          timeout=200)


def result(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def max_weight_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y))))
               for x, y in zip(a["weights"], b["weights"], strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted single-process run."""
    base = tmp_path_factory.mktemp("reference")
    run = single(script(base / "out", base / "ckpt"))
    assert run.returncode == 0, run.stderr[-4000:]
    outcome = result(base / "out" / "single-run0.json")
    assert outcome["steps"] == STEPS and outcome["restored_step"] is None
    return outcome


def test_a_sigkilled_worker_is_restarted_and_loses_no_step(tmp_path, reference):
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--die_at", "23",
                        "--die_signal", "KILL"), max_restarts=1)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "task worker:1 exited with 137; restarting the cluster (restart 1 of 1)" in run.stderr
    for task in ("worker-0", "worker-1"):
        assert not (tmp_path / "out" / f"{task}-run0.json").exists()  # the first run died
        resumed = result(tmp_path / "out" / f"{task}-run1.json")
        assert resumed["mode"] == "multi_worker"
        assert resumed["restored_step"] == 20  # every 10 steps; killed after 23
        assert resumed["steps"] == STEPS
        assert max_weight_diff(resumed, reference) <= 1e-5
    assert "resumed from" in run.stderr and "(epoch 2, continuing after its first 5 batch(es)" in (
        run.stderr)
    for task in ("worker:0", "worker:1"):  # each worker restored its own iterator
        assert (f"[{task}] hybridpar: restored the training input's position from the "
                "checkpoint; no batch is drawn again.") in run.stderr
    # Each worker read its share of the checkpoint and received the rest (shared_restore).
    shares = re.findall(r"\[worker:(\d)\] hybridpar: worker \1 of 2 read ([\d,]+) of the "
                        r"checkpoint's ([\d,]+) bytes of replicated variables", run.stderr)
    assert sorted(worker for worker, _, _ in shares) == ["0", "1"], run.stderr[-4000:]
    read = [int(share.replace(",", "")) for _, share, _ in shares]
    assert sum(read) == int(shares[0][2].replace(",", "")) and max(read) < 0.75 * sum(read)
    # Chief-only files: exactly the kept checkpoints, nothing partial.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "ckpt-00000030", "ckpt-00000040", "ckpt-00000045"]


def test_sigterm_makes_every_worker_save_and_exit_then_training_resumes(tmp_path, reference):
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", "--die_at", "23",
                        "--die_signal", "TERM", "--every_steps", "100"), max_restarts=1)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "[worker:1] hybridpar: received SIGTERM; saving a checkpoint" in run.stderr
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] hybridpar: preempted; checkpoint saved, exiting with 42." in run.stderr
    assert "exited with 42 (preempted, saved a checkpoint); restarting the cluster" in run.stderr
    for task in ("worker-0", "worker-1"):
        resumed = result(tmp_path / "out" / f"{task}-run1.json")
        # TensorFlow's protocol: the signalled worker announces the step after its next one.
        assert resumed["restored_step"] == 25
        assert resumed["steps"] == STEPS
        assert max_weight_diff(resumed, reference) <= 1e-5


def test_sigterm_in_one_process_saves_exits_42_and_resumes(tmp_path, reference):
    command = script(tmp_path / "out", tmp_path / "ckpt", "--every_steps", "100")
    preempted = single([*command, "--die_at", "7", "--die_signal", "TERM"])
    assert preempted.returncode == 42, preempted.stderr[-4000:]
    manifest = json.loads((tmp_path / "ckpt" / "ckpt-00000009" / "manifest.json").read_text())
    assert manifest["reason"] == "preemption"
    assert manifest["data"]["epoch"] == 0 and manifest["data"]["batch"] == 9
    resumed = single(command)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    outcome = result(tmp_path / "out" / "single-run0.json")
    assert outcome["restored_step"] == 9 and outcome["steps"] == STEPS
    assert max_weight_diff(outcome, reference) <= 1e-5


def test_two_workers_to_one_process_and_back_with_a_damaged_latest(tmp_path, reference):
    # 2 workers x 1 replica (MultiWorkerMirroredStrategy uses CPU:0 per worker) write two
    # epochs; one process on one device trains the third from their checkpoint.
    run = launch(script(tmp_path / "cluster", tmp_path / "a", "--epochs", "2"))
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Traceback" not in run.stderr  # the preemption watchers end cleanly
    local = single(script(tmp_path / "local", tmp_path / "a"))
    assert local.returncode == 0, local.stderr[-4000:]
    assert ("written by multi_worker, 2 worker(s) x 1 replica(s), resumed on none, 1 worker(s) "
            "x 1 replica(s); the global batch stays 32 examples per step") in local.stderr
    outcome = result(tmp_path / "local" / "single-run0.json")
    assert outcome["restored_step"] == 30 and outcome["steps"] == STEPS
    assert outcome["topology"]["mode"] == "multi_worker"
    assert max_weight_diff(outcome, reference) <= 1e-5

    # One process writes one epoch; its newest checkpoint is damaged; 2 workers resume
    # from the previous one.
    local = single(script(tmp_path / "local", tmp_path / "b", "--epochs", "1",
                          "--every_steps", "4"))
    assert local.returncode == 0, local.stderr[-4000:]
    state = tmp_path / "b" / "ckpt-00000015" / "state.data-00000-of-00001"
    state.write_bytes(state.read_bytes()[:100])
    shutil.rmtree(tmp_path / "cluster")
    run = launch(script(tmp_path / "cluster", tmp_path / "b"))
    assert run.returncode == 0, run.stderr[-4000:]
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] hybridpar: checkpoint ckpt-00000015 is damaged" in run.stderr
    for task in ("worker-0", "worker-1"):
        resumed = result(tmp_path / "cluster" / f"{task}-run0.json")
        assert resumed["restored_step"] == 12 and resumed["steps"] == STEPS
        assert resumed["topology"]["mode"] == "none"
        assert max_weight_diff(resumed, reference) <= 1e-5


def test_a_worker_that_cannot_see_the_chiefs_checkpoint_fails_at_once_naming_it(tmp_path):
    # Each task gets a directory of its own, as on machines without shared storage: the
    # chief writes into its own, worker:1's stays empty.
    per_task = str(tmp_path / "{task}")
    first = launch(script(tmp_path / "out", per_task, "--epochs", "1"))
    assert first.returncode == 0, first.stderr[-4000:]
    assert [p.name for p in (tmp_path / "worker-0").iterdir()] != []
    assert not list((tmp_path / "worker-1").glob("ckpt-*"))
    run = launch(script(tmp_path / "out", per_task, "--epochs", "2"))
    assert run.returncode != 0
    expected = (f"[worker:1] hybridpar.errors.ConfigError: The chief chose checkpoint "
                f"{tmp_path}/worker-0/ckpt-00000015 (step 15) to restore, but worker:1 cannot "
                f"see it at {tmp_path}/worker-1/ckpt-00000015")
    assert expected in run.stderr, run.stderr[-4000:]
    assert "checkpoint.dir must be a directory that every worker shares" in run.stderr
    assert "Epoch 2/2" not in run.stdout  # nobody trained on from a checkpoint of its own


def test_workers_reading_their_own_files_resume_their_own_positions(tmp_path):
    """FILE sharding over 3 files: worker:0 reads 2 (20 pieces an epoch), worker:1 one (10,
    then empty pieces while the other still has data), each epoch in a new order. After a
    SIGKILL in the last epoch each worker restores its own iterator, so the run ends with
    the weights of the uninterrupted one (drawing the batches again would meet another
    order)."""
    files = ("--files", "3", "--reshuffle")
    reference = launch(script(tmp_path / "reference", tmp_path / "reference-ckpt", *files))
    assert reference.returncode == 0, reference.stderr[-4000:]
    assert "sharding the input by FILE over 2 workers" in reference.stderr
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", *files, "--die_at", "53"),
                 max_restarts=1)
    assert run.returncode == 0, run.stderr[-4000:]
    for task in ("worker:0", "worker:1"):
        said = [line for line in run.stderr.splitlines() if line.startswith(f"[{task}] hybr")]
        assert (f"[{task}] hybridpar: restored the training input's position from the "
                "checkpoint; no batch is drawn again.") in said, "\n".join(said)
    for task in ("worker-0", "worker-1"):
        expected = result(tmp_path / "reference" / f"{task}-run0.json")
        resumed = result(tmp_path / "out" / f"{task}-run1.json")
        assert resumed["restored_step"] == 50  # epoch 3, after its first 10 batches
        assert resumed["steps"] == expected["steps"] == 60
        assert max_weight_diff(resumed, expected) <= 1e-5

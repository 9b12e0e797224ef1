"""PowerSGD on a real 2-worker cluster through `hybridpar launch`: identical weights, resume.

Every run trains scripts/train_checkpoint.py (a 12-32-2 MLP, Adam, 45 optimizer
steps) with communication.compression: powersgd (rank 2, every matrix compressed).
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from test_checkpoint import STEPS, launch, max_weight_diff, result, script  # beside this file

from hybridpar.checkpoint import files

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

POWERSGD = ("--compression", "powersgd", "--rank", "2")


def max_state_diff(a: dict, b: dict) -> float:
    """The largest difference between two runs' own PowerSGD state (the same replicas')."""
    diffs = []
    for x, y in zip(a["compression_state"], b["compression_state"], strict=True):
        assert x["errors"].keys() == y["errors"].keys()
        diffs += [np.abs(np.array(x["errors"][r]) - np.array(y["errors"][r])).max()
                  for r in x["errors"]]
        diffs.append(np.abs(np.array(x["q"]) - np.array(y["q"])).max())
    return float(max(diffs))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict, dict, str, object]:
    base = tmp_path_factory.mktemp("powersgd")
    run = launch(script(base / "out", base / "ckpt", *POWERSGD))
    assert run.returncode == 0, run.stderr[-4000:]
    return (result(base / "out" / "worker-0-run0.json"),
            result(base / "out" / "worker-1-run0.json"), run.stdout + run.stderr, base / "ckpt")


def test_two_workers_with_powersgd_end_with_identical_weights(uninterrupted):
    chief, other, output, _ = uninterrupted
    assert chief["mode"] == "multi_worker" and chief["num_replicas"] == 2
    assert chief["steps"] == STEPS
    assert max_weight_diff(chief, other) == 0.0
    (own,), (others,) = chief["compression_state"], other["compression_state"]
    assert list(own["errors"]) == ["0"] and list(others["errors"]) == ["1"]  # replica-local
    assert own["q"] == others["q"]
    errors = np.array([own["errors"]["0"], others["errors"]["1"]])
    assert errors.shape == (2, 12, 32) and np.abs(errors[0] - errors[1]).max() > 0
    assert chief["history"]["loss"][-1] < chief["history"]["loss"][0] / 2
    line = ("gradient compression powersgd (rank 2): 1 gradient(s) of 1,536 B via PowerSGD, "
            "3 uncompressed (392 B); 1,928 B -> 744 B per step and replica (ratio 0.3859)")
    assert output.count(line) == 2  # once per worker


def test_each_worker_writes_its_own_replicas_error_memory(uninterrupted):
    chief, other, _, directory = uninterrupted
    newest = files.list_checkpoints(directory)[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["step"] == STEPS
    writers = sorted(entry["task"] for name, entry in manifest["files"].items()
                     if name.startswith("state.data-"))
    assert writers == ["worker:0", "worker:1"]  # worker 1 wrote its rows in a file of its own
    saved = tf.train.load_checkpoint(str(newest / "state")).get_tensor("compression/00000")
    rows = [chief["compression_state"][0]["errors"]["0"],
            other["compression_state"][0]["errors"]["1"]]
    np.testing.assert_array_equal(saved, np.array(rows, dtype=saved.dtype))


def test_a_sigkilled_powersgd_cluster_resumes_like_the_uninterrupted_run(tmp_path, uninterrupted):
    run = launch(script(tmp_path / "out", tmp_path / "ckpt", *POWERSGD, "--die_at", "23",
                        "--die_signal", "KILL"), max_restarts=1)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "task worker:1 exited with 137; restarting the cluster" in run.stderr
    for task, reference in zip(("worker-0", "worker-1"), uninterrupted[:2], strict=True):
        resumed = result(tmp_path / "out" / f"{task}-run1.json")
        assert resumed["restored_step"] == 20 and resumed["steps"] == STEPS
        assert max_weight_diff(resumed, reference) == 0.0
        assert max_state_diff(resumed, reference) == 0.0

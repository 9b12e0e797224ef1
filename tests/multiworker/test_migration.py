"""The migration guides' scripts (examples/migration/) on real localhost clusters.

Every "after" runs as users run it (``hybridpar launch``) and must train like
hybridpar's single-device run of the same problem (the script with
``--mode none``: same data, seed and global batch); the tf_keras "befores" run
on the same clusters and must reach the same result, so each guide shows the
same training in fewer lines. The Horovod "before" cannot run (Horovod does
not build on TensorFlow >= 2.16) and is parse-checked.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from launch_helpers import launch_command

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDES = ROOT / "examples" / "migration"


def environment() -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def launch(script: pathlib.Path, out: pathlib.Path, workers: int, ps: int = 0) -> dict:
    """Runs ``script --out out`` on a localhost cluster; returns ``{task: result}``."""
    command = [*launch_command(), "--workers", str(workers), "--ps", str(ps), "--timeout", "200",
               "--", sys.executable, str(script), "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment(),
                         timeout=260)
    assert run.returncode == 0, run.stderr[-4000:]
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def single_device(script: pathlib.Path, out: pathlib.Path) -> dict:
    """hybridpar's single-device run: the "after" script with ``--mode none``."""
    run = subprocess.run([sys.executable, str(script), "--out", str(out), "--mode", "none"],
                         capture_output=True, text=True, env=environment(), timeout=200)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads((out / "single.json").read_text())
    assert result["mode"] == "none"
    return result


def assert_trains_like(result: dict, reference: dict) -> None:
    for got, want in zip(result["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-5)
    assert reference["loss"][-1] < 0.5 * reference["loss"][0]  # it learnt something


@pytest.mark.parametrize("guide", ["tf_keras_multi_worker", "horovod"])
def test_multi_worker_after_trains_like_one_device(guide, tmp_path):
    script = GUIDES / guide / "after.py"
    reference = single_device(script, tmp_path / "single")
    workers = launch(script, tmp_path / "cluster", workers=2)
    assert set(workers) == {"worker-0", "worker-1"}
    for worker in workers.values():
        assert worker["mode"] == "multi_worker" and worker["num_replicas"] == 2
        assert_trains_like(worker, reference)
    assert sorted(p.name for p in (tmp_path / "cluster" / "checkpoints").iterdir()) == [
        "ckpt-00000016", "ckpt-00000032", "ckpt-00000048"]  # the chief's, every epoch


def test_tf_keras_multi_worker_before_trains_like_the_after(tmp_path):
    reference = single_device(GUIDES / "tf_keras_multi_worker" / "after.py", tmp_path / "single")
    workers = launch(GUIDES / "tf_keras_multi_worker" / "before.py", tmp_path / "before", 2)
    assert set(workers) == {"worker-0", "worker-1"}
    for worker in workers.values():
        assert worker["num_replicas"] == 2
        assert_trains_like(worker, reference)


def test_parameter_server_after_and_before_train_like_one_device(tmp_path):
    guide = GUIDES / "tf_keras_parameter_server"
    reference = single_device(guide / "after.py", tmp_path / "single")
    after = launch(guide / "after.py", tmp_path / "after", workers=1, ps=2)
    assert set(after) == {"chief"} and after["chief"]["mode"] == "parameter_server"
    assert_trains_like(after["chief"], reference)
    before = launch(guide / "before.py", tmp_path / "before", workers=1, ps=2)
    assert set(before) == {"chief"}
    assert_trains_like(before["chief"], reference)


def test_horovod_before_is_the_documented_horovod_script():
    tree = ast.parse((GUIDES / "horovod" / "before.py").read_text())
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert {"init", "DistributedOptimizer", "BroadcastGlobalVariablesCallback", "rank",
            "ModelCheckpoint"} <= calls
    imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    assert "horovod.tensorflow.keras" in imports

"""The Ray Train migration guide (examples/migration/ray_train/) on the session's Ray cluster.

Both scripts are drivers that connect to the running cluster (``--address``)
and run a two-worker TensorflowTrainer. The "after" (Keras 3 under
``hybridpar.scope``) must train like hybridpar's single-device run of the same
problem (tf_keras_multi_worker/after.py ``--mode none``: same data, seed and
global batch), and so must the tf_keras "before".
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

pytest.importorskip("ray.train", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')

GUIDES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "migration"


def environment() -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "HYBRIDPAR_LOGICAL_CPUS"):
        env.pop(name, None)
    return env


def run(*command: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True,
                          env=environment(), timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def results(out: pathlib.Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("single")
    run(str(GUIDES / "tf_keras_multi_worker" / "after.py"), "--out", str(out), "--mode", "none")
    return results(out)["single"]


def assert_trains_like(result: dict, reference: dict) -> None:
    for got, want in zip(result["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-5)


def test_ray_train_after_trains_like_one_device(ray_address, tmp_path, reference):
    done = run(str(GUIDES / "ray_train" / "after.py"), "--out", str(tmp_path),
               "--address", ray_address)
    assert "final step: 48" in done.stdout  # RayTrainReport: 3 epochs of 16 steps
    workers = results(tmp_path)
    assert set(workers) == {"worker-0", "worker-1"}
    for worker in workers.values():
        assert worker["mode"] == "multi_worker" and worker["num_replicas"] == 2
        assert_trains_like(worker, reference)


def test_ray_train_tf_keras_before_trains_like_the_after(ray_address, tmp_path, reference):
    run(str(GUIDES / "ray_train" / "before.py"), "--out", str(tmp_path), "--address", ray_address)
    workers = results(tmp_path)
    assert set(workers) == {"worker-0", "worker-1"}
    for worker in workers.values():
        assert worker["num_replicas"] == 2
        assert_trains_like(worker, reference)

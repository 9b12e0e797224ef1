"""Ray Train's TensorflowTrainer with hybridpar, on the session's real local Ray cluster.

`train_loop_per_worker` is ray_loops.train_loop: a plain Keras 3 `model.fit` under
`hybridpar.scope()`. Every Ray run is compared with the same loop run in one plain
process (no Ray, no TF_CONFIG) on the same data, seed and global batch.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import ray_loops  # beside this file; Ray's workers import it too

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ray_train = pytest.importorskip(
    "ray.train", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402

HERE = pathlib.Path(__file__).parent

STEPS = 45  # 3 epochs of 15 global batches


def results(out: pathlib.Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def max_weight_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y))))
               for x, y in zip(a["weights"], b["weights"], strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The loop in one plain process: one device, no cluster."""
    out = tmp_path_factory.mktemp("single")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "HYBRIDPAR_LOGICAL_CPUS")}
    code = f"import ray_loops; ray_loops.train_loop({{'out': {str(out)!r}}})"
    run = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    outcome = results(out)["single"]
    assert outcome["mode"] == "none" and outcome["steps"] == STEPS
    return outcome


def fit(ray_address, tmp_path, loop_config: dict, *, max_failures: int = 0,
        env_vars: dict | None = None):
    trainer = TensorflowTrainer(
        ray_loops.train_loop,
        train_loop_config=loop_config,
        scaling_config=ray_train.ScalingConfig(num_workers=2),
        run_config=ray_train.RunConfig(
            storage_path=str(tmp_path / "ray_results"), name="hybridpar",
            failure_config=ray_train.FailureConfig(max_failures=max_failures),
            worker_runtime_env={"env_vars": env_vars or {}}),
    )
    return trainer.fit()


def test_two_ray_workers_train_like_one_process_and_report(ray_address, tmp_path, reference):
    config = {"out": str(tmp_path / "out"), "checkpoint_dir": str(tmp_path / "ckpt"),
              "report": True}
    result = fit(ray_address, tmp_path, config)
    assert result.error is None
    workers = results(tmp_path / "out")
    assert set(workers) == {"worker-0", "worker-1"}
    for worker in workers.values():
        assert worker["mode"] == "multi_worker" and worker["num_replicas"] == 2
        assert worker["main_thread"] is False  # Ray Train v2 runs the loop in a thread
        assert worker["legacy_keras"] == "1"  # set by Ray; Keras 3 trains regardless
        assert worker["steps"] == STEPS
        assert max_weight_diff(worker, reference) <= 1e-5
    np.testing.assert_allclose(workers["worker-0"]["history"]["loss"],
                               reference["history"]["loss"], rtol=1e-5)
    # RayTrainReport: Ray's checkpoint manager holds hybridpar's final checkpoint.
    assert result.metrics["step"] == STEPS and result.metrics["final"] == 1.0
    with result.checkpoint.as_directory() as directory:
        manifest = json.loads((pathlib.Path(directory) / "manifest.json").read_text())
    assert manifest["step"] == STEPS


def test_a_sigkilled_ray_worker_resumes_from_the_checkpoint_at_the_step(
        ray_address, tmp_path, reference):
    config = {"out": str(tmp_path / "out"), "checkpoint_dir": str(tmp_path / "ckpt"),
              "every_steps": 10, "kill_at": 23, "kill_marker": str(tmp_path / "killed")}
    result = fit(ray_address, tmp_path, config, max_failures=1)
    assert result.error is None
    assert (tmp_path / "killed").read_text() == "23"  # the first attempt died mid-epoch 2
    for worker in results(tmp_path / "out").values():
        assert worker["mode"] == "multi_worker"
        assert worker["restored_step"] == 20  # every 10 steps; killed after 23
        assert worker["steps"] == STEPS
        assert max_weight_diff(worker, reference) <= 1e-5


def test_two_ray_workers_x_two_stages_train_like_one_process(ray_address, tmp_path, reference):
    config = {"out": str(tmp_path / "out"), "stages": 2}
    result = fit(ray_address, tmp_path, config, env_vars={"HYBRIDPAR_LOGICAL_CPUS": "2"})
    assert result.error is None
    for worker in results(tmp_path / "out").values():
        assert worker["mode"] == "multi_worker" and worker["stages"] == 2
        assert worker["devices"] == ["/device:CPU:0", "/device:CPU:1"]
        assert worker["num_replicas"] == 2  # one model-parallel replica per worker
        assert max_weight_diff(worker, reference) <= 1e-5

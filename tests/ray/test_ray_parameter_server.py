"""Parameter-server training on Ray: `hybridpar launch --engine ray --workers 2 --ps 2`.

Ray Train has no parameter-server mode (ray-project/ray#41089); the Ray engine
runs the same cluster as the local one, each task in its Ray actor. The script is
the parameter-server tests' tests/multiworker/scripts/train_ps.py.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from launch_helpers import launch_command

pytestmark = [pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "multiworker" / "scripts" / "train_ps.py"


def launch_on_ray(ray_address: str, out: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [*launch_command("--engine", "ray", "--address", ray_address), "--workers", "2",
         "--ps", "2", "--timeout", "240", "--", sys.executable, str(SCRIPT), "--out", str(out),
         *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def chief(out: pathlib.Path) -> dict:
    return json.loads((out / "chief-0.json").read_text())


def test_ps_on_ray_shard_the_embedding_over_both_ps_and_survive_a_killed_worker(
        ray_address, tmp_path):
    # One run checks both (each costs a cluster start): the sharding, and no step lost
    # when the chief SIGKILLs worker:1 at step 50 of 120.
    result = launch_on_ray(ray_address, tmp_path, "--epochs", "3", "--steps", "40",
                           "--kill", "worker:1", "--kill_at", "50")
    assert result.returncode == 0, result.stderr[-4000:]
    run = chief(tmp_path)
    assert run["mode"] == "parameter_server"
    assert run["table_type"] == "ShardedVariable"
    assert sorted(device for device, _ in run["table_shards"]) == [
        f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    assert [shape for _, shape in run["table_shards"]] == [[2000, 16], [2000, 16]]
    for task in ("worker:0", "worker:1", "ps:0", "ps:1"):
        assert f"[{task}] hybridpar: {task} serving the parameter-server cluster" in result.stderr
    assert "hybridpar launch: engine ray: " in result.stderr
    assert "[chief:0] killing worker:1" in result.stdout
    assert "task worker:1 exited with 137 (killed by SIGKILL)" not in result.stderr  # no restart
    assert run["iterations"] in (120, 121)  # no step lost (the in-flight one may run twice)
    assert run["steps_by_worker"][0] > run["steps_by_worker"][1]
    assert len(run["history"]["loss"]) == 3
    assert "task chief:0 exited with 0; stopped the worker and ps tasks" in result.stderr

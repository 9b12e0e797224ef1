"""``hybridpar.initialize()`` called by the script: two real worker processes on localhost.

Each process imports hybridpar without TF_CONFIG (so import initializes nothing), sets
TF_CONFIG itself, as a custom launcher would, and calls ``hybridpar.initialize()``
before its first op; the two then train one synchronous model.
"""

import json
import os
import subprocess
import sys

import portpicker
import pytest

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

SCRIPT = """
import json, os, sys
import hybridpar
os.environ["TF_CONFIG"] = sys.argv[1]
cluster = hybridpar.initialize()  # before the first op; without it scope() could not join
import keras, numpy as np, tensorflow as tf
x = np.arange(64 * 4, dtype="float32").reshape(64, 4) / 256
data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(16)
keras.utils.set_random_seed(1)
with hybridpar.scope({"data": {"shard_policy": "data"},
                      "communication": {"timeout_seconds": 60}}) as hs:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(data, epochs=1, verbose=0)
print(json.dumps({"task": str(cluster.task), "mode": hs.mode, "replicas": hs.num_replicas,
                  "weights": [w.tolist() for w in model.get_weights()]}))
"""


def test_initialize_called_by_the_script_joins_the_cluster():
    workers = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "HYBRIDPAR_LOGICAL_CPUS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240) for p in processes]
    finally:
        for process in processes:
            process.kill()
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-4000:]
    runs = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    assert [(r["task"], r["mode"], r["replicas"]) for r in runs] == [
        ("worker:0", "multi_worker", 2), ("worker:1", "multi_worker", 2)]
    assert runs[0]["weights"] == runs[1]["weights"]  # one synchronous model

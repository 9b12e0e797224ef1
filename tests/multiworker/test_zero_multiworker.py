"""ZeRO stage 1 (shard_optimizer_state) on a real 2-worker cluster through `hybridpar launch`.

scripts/train_checkpoint.py --shard: a 12-32-2 MLP (482 weights), Adam, 45 optimizer steps.
"""

import pytest
from test_checkpoint import STEPS, launch, max_weight_diff, reference, result, script  # noqa: F401

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]


def test_two_sharded_workers_train_to_the_single_process_weights(tmp_path, reference):  # noqa: F811
    run = launch(script(tmp_path / "out", tmp_path / "ckpt" / "{task}", "--shard"))
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
    # each worker holds only its replicas' shards and only the chief writes: not saved yet
    assert output.count("do not hold the optimizer state that data_parallel."
                        "shard_optimizer_state=true shards over 2 workers yet") == 2

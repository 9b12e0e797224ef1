"""A script in the order of TensorFlow's tutorials (data first) works unchanged in every mode.

scripts/tutorial_order.py builds its datasets (tfds, tf.data over arrays,
the arrays) and a callback before ``hybridpar.scope()``, the model inside,
then calls ``fit`` with ``validation_data``, ``evaluate`` and ``predict`` on
datasets made before and after the scope. Run alone (mode none, 2 replicas x
2 stages) and on real clusters (2 workers; parameter servers with an
evaluator). Each run's evaluate/predict figures are compared with plain Keras
in this process on the run's final weights.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import hybridpar_models
import keras
import numpy as np
import pytest
from launch_helpers import launch_command

pytestmark = [pytest.mark.multiworker, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = pathlib.Path(__file__).with_name("scripts")
SCRIPT = SCRIPTS / "tutorial_order.py"
EPOCHS, STEPS, VALIDATION_STEPS, BATCH = 2, 6, 3, 64  # as in the script
INPUTS = ("tfdata_first", "tfdata_after", "tfds_first", "tfds_after", "numpy")
LAUNCH = {"multi_worker": ["--workers", "2"],
          "parameter_server": ["--workers", "1", "--ps", "1", "--evaluator"]}
BUILT_OUTSIDE = "ConfigError: Model 'digits_mlp' holds variables created outside hybridpar.scope()"


def run(command: list[str], launch: list[str] | None = None) -> subprocess.CompletedProcess:
    """``command`` alone, or on a local cluster started with ``launch`` flags."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    if launch is not None:
        command = [*launch_command(), *launch, "--timeout", "300", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=400)


def tutorial_order(mode: str, out: pathlib.Path, data_dir: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--mode", mode, "--out", str(out),
               "--data_dir", data_dir]
    if mode == "parameter_server":
        command += ["--checkpoint_dir", str(out / "checkpoints")]
    return run(command, LAUNCH.get(mode))


def test_upstream_objects_made_before_the_chief_connects_are_stranded_but_take_moves_them():
    result = run([sys.executable, str(SCRIPTS / "upstream_ps_early_objects.py")],
                 ["--workers", "1", "--ps", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(re.search(r"\[chief:0\] (\{.*\})", result.stdout)[1])
    assert seen["device"] == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert seen["iterate"].startswith("InvalidArgumentError: /job:localhost/replica:0/task:0/"
                                      "device:CPU:0 unknown device. [Op:AnonymousIteratorV3]")
    assert seen["read_variable"].startswith("InvalidArgumentError: Client for target "
                                            "/job:localhost/replica:0/task:0 not found")
    # What strategies.chief_datasets relies on: take(-1) on the chief's device runs the
    # same pipeline.
    assert seen["moved_device"] == "/job:chief/replica:0/task:0/device:CPU:0"
    assert seen["moved_equal"] == "true"
    assert "Cannot assign a device for operation PyFunc" in seen["moved_generator"]


def single_process(arrays: dict) -> tuple[dict, np.ndarray, dict]:
    """Plain Keras on the run's final weights: evaluate (all, and the validation steps), predict."""
    model = hybridpar_models.get("digits_mlp")()
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.set_weights([arrays[f"weight_{i}"] for i in range(len(model.weights))])
    x, y = arrays["x_test"], arrays["y_test"]
    evaluation = model.evaluate(x, y, batch_size=BATCH, return_dict=True, verbose=0)
    seen = VALIDATION_STEPS * BATCH  # validation_steps batches of the validation set
    validation = model.evaluate(x[:seen], y[:seen], batch_size=BATCH, return_dict=True,
                                verbose=0)
    return evaluation, model.predict(x, batch_size=BATCH, verbose=0), validation


def in_file_shard_order(predicted: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """``predicted`` rows put back in the dataset's order, checking they are a permutation.

    With FILE sharding (tfds's 2 test files over 2 workers) each worker predicts
    the batches of its own file and Keras concatenates them step by step, so the
    rows come in another order than one process reading both files interleaved.
    """
    rows = [int(np.argmin(np.abs(predictions - row).max(axis=1))) for row in predicted]
    assert sorted(rows) == list(range(len(predictions))), "not a permutation of the examples"
    assert rows != sorted(rows)  # the reordering this accounts for is real
    return predicted[np.argsort(rows)]


def check_figures(task: dict, arrays: dict, reference: tuple) -> None:
    evaluation, predictions, _ = reference
    assert set(task["evaluation"]) == set(INPUTS)
    for name in INPUTS:  # made before and after the scope, tfds, tf.data and arrays
        for metric, value in evaluation.items():
            assert task["evaluation"][name][metric] == pytest.approx(value, abs=1e-5), name
        predicted = arrays[f"predict_{name}"]
        if task["mode"] == "multi_worker" and name.startswith("tfds"):
            predicted = in_file_shard_order(predicted, predictions)
        assert np.max(np.abs(predicted - predictions)) <= 1e-5, name


@pytest.mark.parametrize("mode", ["none", "hybrid_2x2", "multi_worker", "parameter_server"])
def test_a_script_in_the_tutorials_order_runs_unchanged(mode, tmp_path, digits_data_dir):
    result = tutorial_order(mode, tmp_path, digits_data_dir)
    assert result.returncode == 0, result.stderr[-5000:]
    trainer = {"none": "single", "hybrid_2x2": "single", "multi_worker": "worker-0",
               "parameter_server": "chief-0"}[mode]
    task = json.loads((tmp_path / f"{trainer}.json").read_text())
    arrays = dict(np.load(tmp_path / f"{trainer}.npz"))
    assert task["mode"] == ("mirrored" if mode == "hybrid_2x2" else mode)
    assert task["iterations"] == EPOCHS * STEPS
    assert task["batches_per_epoch"] == [STEPS] * EPOCHS
    # Validation on the dataset made before the scope ran at the end of every epoch...
    assert task["epoch_logs"] == [["accuracy", "loss", "val_accuracy", "val_loss"]] * EPOCHS
    assert len(task["history"]["val_loss"]) == EPOCHS
    # ... and the last one saw the final weights, over validation_steps batches.
    reference = single_process(arrays)
    for metric, value in reference[2].items():
        assert task["history"][f"val_{metric}"][-1] == pytest.approx(value, abs=1e-5)
    check_figures(task, arrays, reference)
    if mode == "none":  # one device: a plain model is what the strategy would build
        assert task["model_first_compile"] == "ok"
    else:
        assert task["model_first_compile"].startswith(BUILT_OUTSIDE)
    if mode != "parameter_server":
        assert task["model_first_predict"] == "ok"  # a plain Keras model on one device
        assert task["generated_first_evaluate"] == "ok"
        return
    assert task["model_first_predict"].startswith(
        "ConfigError: Model 'digits_mlp' was built before hybridpar.scope() connected this "
        "chief to the parameter-server cluster, so model.predict cannot use it")
    assert task["generated_first_evaluate"].startswith(
        "ConfigError: The dataset given to model.evaluate was created before hybridpar.scope() "
        "connected this chief to the parameter-server cluster, and its function")
    assert "runs PyFunc" in task["generated_first_evaluate"]
    assert ("hybridpar: the validation dataset (validation_data) was created before this chief "
            "connected to the cluster; it runs on /job:chief/replica:0/task:0/device:CPU:0"
            ) in result.stderr
    # The evaluator ran the same script: a local strategy, every checkpoint validated.
    evaluator = json.loads((tmp_path / "evaluator-0.json").read_text())
    evaluator_arrays = dict(np.load(tmp_path / "evaluator-0.npz"))
    assert evaluator["is_evaluator"] and evaluator["mode"] == "none"
    assert evaluator["history"]["step"] == [STEPS, 2 * STEPS]
    assert evaluator["history"]["val_loss"] == pytest.approx(task["history"]["val_loss"],
                                                             abs=1e-5)
    for i in range(len([k for k in arrays if k.startswith("weight_")])):
        np.testing.assert_array_equal(evaluator_arrays[f"weight_{i}"], arrays[f"weight_{i}"])
    check_figures(evaluator, evaluator_arrays, reference)
    assert evaluator["model_first_compile"] == "ok"  # mode none: a plain model is the same
    assert evaluator["generated_first_evaluate"] == "ok"

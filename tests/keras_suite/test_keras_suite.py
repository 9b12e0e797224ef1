"""Keras's own tests give the same results after hybridpar was used and left in the process.

The test modules shipped in the installed keras wheel for the TensorFlow
backend's distribution and optimizer, the trainer, core layers, batch normalization,
models, callbacks, optimizers and saving run twice in fresh processes: once plain, once
with ``hybridpar_was_used`` (every hybridpar fix installed, a staged strategy
alive). Each test must end the same way in both. Modules that need JAX,
PyTorch or Orbax are skipped by name.

Run alone with ``pytest -m keras_suite``.
"""

import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import keras
import pytest

pytestmark = [pytest.mark.keras_suite, pytest.mark.slow]

KERAS = pathlib.Path(keras.__file__).parent / "src"
MODULES = [
    "backend/tensorflow/distribute_test.py",
    "backend/tensorflow/optimizer_distribute_test.py",
    "trainers/trainer_test.py",
    "trainers/epoch_iterator_test.py",
    "layers/core/dense_test.py",
    "layers/core/embedding_test.py",
    "layers/core/einsum_dense_test.py",
    "layers/core/input_layer_test.py",
    "layers/core/lambda_layer_test.py",
    "layers/core/masking_test.py",
    "layers/core/wrapper_test.py",
    "layers/normalization/batch_normalization_test.py",
    "models/model_test.py",
    "models/sequential_test.py",
    "models/functional_test.py",
    "callbacks/callback_test.py",
    "callbacks/backup_and_restore_test.py",
    "callbacks/csv_logger_test.py",
    "callbacks/early_stopping_test.py",
    "callbacks/model_checkpoint_test.py",
    "callbacks/tensorboard_test.py",
    "optimizers/optimizer_test.py",
    "optimizers/adam_test.py",
    "optimizers/sgd_test.py",
    "optimizers/loss_scale_optimizer_test.py",
    "saving/saving_api_test.py",
    "saving/saving_lib_test.py",
]
OTHER_BACKENDS = ("import jax", "import torch", "orbax")


def runnable_modules() -> list[str]:
    """The listed modules that exist in this keras and need no other backend."""
    found = []
    for module in MODULES:
        path = KERAS / module
        if path.is_file() and not any(name in path.read_text() for name in OTHER_BACKENDS):
            found.append(str(path))
    return found


def start(tmp_path: pathlib.Path, label: str, plugin: bool) -> subprocess.Popen:
    """Starts the Keras tests in a fresh pytest process writing ``<label>.xml``."""
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini),
               "--rootdir", str(tmp_path), f"--junitxml={tmp_path / label}.xml",
               *runnable_modules()]
    env = {"PATH": "/usr/bin:/bin", "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "HOME": str(tmp_path)}
    if plugin:
        command[3:3] = ["-p", "hybridpar_was_used"]
        env["PYTHONPATH"] = str(pathlib.Path(__file__).parent)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env=env)


def outcomes(run: subprocess.Popen, report: pathlib.Path) -> tuple[dict[str, str], str]:
    """Each test id's outcome (passed, failed, error, skipped), and what pytest printed."""
    output, _ = run.communicate(timeout=1500)
    assert report.exists(), output[-5000:]
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        results[f"{case.get('classname')}::{case.get('name')}"] = kinds[0] if kinds else "passed"
    return results, output


def test_keras_tests_end_the_same_after_hybridpar_was_used(tmp_path):
    runs = {label: start(tmp_path, label, plugin=label != "plain")
            for label in ("plain", "after_hybridpar")}  # side by side: mostly one core each
    plain, _ = outcomes(runs["plain"], tmp_path / "plain.xml")
    after, output = outcomes(runs["after_hybridpar"], tmp_path / "after_hybridpar.xml")
    assert "hybridpar fixes installed for the Keras tests: " in output
    assert len(plain) > 300, f"only {len(plain)} Keras tests ran"
    differing = {name: (plain.get(name), after.get(name))
                 for name in sorted(set(plain) | set(after)) if plain.get(name) != after.get(name)}
    assert not differing, f"{len(differing)} Keras test(s) end differently: {differing}"

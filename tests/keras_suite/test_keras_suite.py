"""Keras's own tests give the same results after hybridpar was used and left in the process.

The test modules shipped in the installed keras wheel for the TensorFlow
backend's distribution and optimizer, the trainer, core layers, batch normalization,
models, callbacks, optimizers and saving run in a fresh process with
``hybridpar_was_used`` (every hybridpar fix installed, a staged strategy alive).
Each test must end as it does in a fresh process without hybridpar. Modules that
need JAX, PyTorch or Orbax are skipped by name.

The plain outcomes of the pinned Keras and TensorFlow are recorded in
``baselines/`` (``python tests/keras_suite/test_keras_suite.py`` records them for
the installed versions), so the suite runs the Keras tests once, not twice: every
test whose outcome differs from the record is run again plain, in a fresh process,
and only a difference that this plain run confirms fails. Without a record for the
installed versions, both runs are made side by side.

Run alone with ``pytest -m keras_suite``.
"""

import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import keras
import pytest
import tensorflow as tf

pytestmark = [pytest.mark.keras_suite, pytest.mark.slow]

KERAS = pathlib.Path(keras.__file__).parent / "src"
BASELINE = (pathlib.Path(__file__).parent / "baselines"
            / f"keras-{keras.__version__}_tensorflow-{tf.__version__}.json")
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


def start(tmp_path: pathlib.Path, label: str, plugin: bool,
          tests: list[str] | None = None) -> subprocess.Popen:
    """Starts Keras tests (``tests`` ids, or every runnable module) in a fresh pytest process
    writing ``<label>.xml``."""
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    selected = [str(KERAS / test) for test in tests] if tests is not None else runnable_modules()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini),
               "--rootdir", str(KERAS), f"--junitxml={tmp_path / label}.xml", *selected]
    env = {"PATH": "/usr/bin:/bin", "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "HOME": str(tmp_path)}
    if plugin:
        command[3:3] = ["-p", "hybridpar_was_used"]
        env["PYTHONPATH"] = str(pathlib.Path(__file__).parent)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env=env)


def case_id(case: ElementTree.Element) -> str:
    """``path/to/module_test.py::Class::test`` of a junit test case (classname is dotted)."""
    *module, cls = case.get("classname").split(".")
    return f"{'/'.join(module)}.py::{cls}::{case.get('name')}"


def outcomes(run: subprocess.Popen, report: pathlib.Path) -> tuple[dict[str, str], str]:
    """Each test id's outcome (passed, failed, error, skipped), and what pytest printed."""
    output, _ = run.communicate(timeout=1500)
    assert report.exists(), output[-5000:]
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        results[case_id(case)] = kinds[0] if kinds else "passed"
    return results, output


def differences(plain: dict[str, str], after: dict[str, str]) -> dict[str, tuple]:
    """Tests that end differently (or ran in only one of the runs): id -> (plain, after)."""
    return {name: (plain.get(name), after.get(name))
            for name in sorted(set(plain) | set(after)) if plain.get(name) != after.get(name)}


def test_keras_tests_end_the_same_after_hybridpar_was_used(tmp_path):
    if BASELINE.exists():
        after, output = outcomes(start(tmp_path, "after_hybridpar", plugin=True),
                                 tmp_path / "after_hybridpar.xml")
        plain = json.loads(BASELINE.read_text())
        suspects = [name for name in differences(plain, after) if name in after]
        if suspects:
            rerun, _ = outcomes(start(tmp_path, "plain", plugin=False, tests=suspects),
                                tmp_path / "plain.xml")
            plain.update(rerun)
    else:
        runs = {label: start(tmp_path, label, plugin=label != "plain")
                for label in ("plain", "after_hybridpar")}  # side by side: mostly one core each
        plain, _ = outcomes(runs["plain"], tmp_path / "plain.xml")
        after, output = outcomes(runs["after_hybridpar"], tmp_path / "after_hybridpar.xml")
    assert "hybridpar fixes installed for the Keras tests: " in output
    assert len(after) > 300, f"only {len(after)} Keras tests ran"
    differing = differences(plain, after)
    assert not differing, f"{len(differing)} Keras test(s) end differently: {differing}"


def record_baseline(directory: pathlib.Path) -> None:
    """Runs the Keras tests plain and writes their outcomes to ``BASELINE``."""
    plain, output = outcomes(start(directory, "plain", plugin=False), directory / "plain.xml")
    assert len(plain) > 300, output[-5000:]
    BASELINE.parent.mkdir(exist_ok=True)
    BASELINE.write_text(json.dumps(plain, indent=1, sort_keys=True) + "\n")
    print(f"{len(plain)} outcomes written to {BASELINE}")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        record_baseline(pathlib.Path(scratch))

"""hybridpar's fixes act on hybridpar's strategies only, are installed while needed, and undo.

Fresh processes (``leak_check.py``, ``compat_lifecycle.py`` beside this file)
make the checks independent of what other tests installed.
"""

import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import upstream_keras  # beside this file
from upstream_runner import run_case  # beside this file

import hybridpar
from hybridpar import compat

pytestmark = pytest.mark.strategy

HERE = pathlib.Path(__file__).parent
STAGE_FIXES = {"stage_calls", "stage_gradients"}
# Patches installed for parameter-server strategies only (never by a mirrored fit).
PS_FIXES = {"shard_views", "sharded_embedding", "sharded_numpy", "atomic_updates"}


def trained_weights(mode: str, out: pathlib.Path) -> dict[str, np.ndarray]:
    completed = subprocess.run([sys.executable, str(HERE / "leak_check.py"), mode, str(out)],
                               capture_output=True, text=True, timeout=300, cwd=HERE)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with np.load(out) as arrays:
        return dict(arrays)


@pytest.mark.slow
def test_plain_keras_trains_bit_for_bit_after_hybridpar_was_used(tmp_path):
    plain = trained_weights("plain", tmp_path / "plain.npz")
    after = trained_weights("after_hybridpar", tmp_path / "after.npz")
    assert sorted(plain) == sorted(after)
    for name in plain:
        np.testing.assert_array_equal(after[name], plain[name], err_msg=name)


@pytest.fixture(scope="module")
def lifecycle() -> dict:
    return run_case(HERE / "compat_lifecycle.py", "")


@pytest.mark.slow
def test_fixes_are_installed_only_while_something_needs_them(lifecycle):
    groups = lifecycle["groups"]
    assert lifecycle["before"]
    staged = lifecycle["staged_alive"]
    assert all(staged[name] for name, group in groups.items() if group in ("core", "stages"))
    assert not any(staged[name] for name in PS_FIXES) and not staged["stage_marks"]
    assert lifecycle["inside_stage_block"]["stage_marks"]
    assert not any(lifecycle["after_gc"].values()), lifecycle["after_gc"]
    assert all(lifecycle["everything_held"].values())
    assert all(lifecycle["reinstalled"][name] for name, g in groups.items() if g == "core")


@pytest.mark.slow
def test_uninstall_restores_every_original(lifecycle):
    assert lifecycle["uninstalled"]
    assert lifecycle["uninstalled_after_release"], "a release after uninstall() re-patched"
    assert lifecycle["after_release_and_gc"]


def test_installed_fixes_are_listed_for_bug_reports():
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}):
        names = {fix.name for fix in compat.installed()}
        text = compat.describe()
    assert {"trainer_hooks", "replica_share", "metric_reduction"} <= names
    assert "symbolic_build       installed, in trainer_hooks's patch" in text
    assert "[keras-team/keras#20585]" in text and "TensorFlow 2.21" in text


class OwnStep(keras.Sequential):
    """A model whose own train_step computes its loss with Keras's compute_loss."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights, strict=True))
        return {"loss": loss}


def own_step_fit(config: dict, dataset: tf.data.Dataset) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    with hybridpar.scope(config):
        model = OwnStep([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(dataset, epochs=2, verbose=0)
    return model.get_weights()


def test_own_train_step_with_microbatches_is_refused_before_the_first_step():
    with hybridpar.scope({"model_parallel": {"microbatches": 2},
                          "data_parallel": {"mode": "none"}}):
        model = OwnStep([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    with pytest.raises(hybridpar.ConfigError,
                       match=r"OwnStep overrides train_step, so hybridpar cannot split its "
                             r"batches into microbatches\. Received: "
                             r"model_parallel\.microbatches=2\."):
        model.fit(upstream_keras.FEATURES, upstream_keras.TARGETS, batch_size=8, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("global_batch", [None, 16], ids=["counted", "folded-into-gradients"])
def test_own_train_step_gets_the_replica_share_weighting(global_batch, tmp_path):
    single = own_step_fit({"data_parallel": {"mode": "none"}},
                          upstream_keras.file_dataset(str(tmp_path)))
    mirrored = own_step_fit({"data_parallel": {"mode": "mirrored"},
                             "data": {"global_batch_size": global_batch}},
                            upstream_keras.file_dataset(str(tmp_path)))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(single, mirrored, strict=True))
    assert diff <= 1e-5

"""Sidecar evaluation in one process: a chief's checkpoints, then the evaluator task's fit.

``TF_CONFIG`` names a chief and an evaluator (no server is started by either:
the chief trains in one process); the chief trains first and writes its
checkpoints and end record, then ``hybridpar.scope()`` is entered as the
evaluator. Real clusters, with the evaluator watching while the chief trains,
are in tests/multiworker/test_evaluator.py.
"""

import json
import logging
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import hybridpar
from hybridpar import CheckpointMismatchError, ConfigError
from hybridpar.checkpoint import end_record

pytestmark = pytest.mark.strategy

EPOCHS, BATCH = 3, 32
CLUSTER = {"chief": ["localhost:1"], "evaluator": ["localhost:2"]}


def as_task(monkeypatch, task_type: str) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER,
                                                "task": {"type": task_type, "index": 0}}))


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    return x, y, tf.data.Dataset.from_tensor_slices((x[:96], y[:96])).batch(BATCH)


def build(hidden: int = 16) -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def settings(directory, **evaluator) -> dict:
    return {"data_parallel": {"mode": "none"}, "data": {"global_batch_size": BATCH},
            "checkpoint": {"dir": str(directory), "keep": 5},
            "evaluator": {"poll_seconds": 0.05, "timeout_seconds": 5, **evaluator}}


@pytest.fixture(scope="module")
def trained_chief(tmp_path_factory):
    """The chief's training, once: its model, History and checkpoints (8 steps per epoch)."""
    directory = tmp_path_factory.mktemp("chief") / "ckpt"
    with pytest.MonkeyPatch.context() as monkeypatch:
        as_task(monkeypatch, "chief")
        x, y, validation = data()
        keras.utils.set_random_seed(1)
        with hybridpar.scope(settings(directory)) as hs:
            model = build()
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=validation,
                            callbacks=hs.callbacks(), verbose=0)
    return model, history, directory


@pytest.fixture
def chief(trained_chief, tmp_path, monkeypatch):
    """A copy of the chief's checkpoint dir, seen from the evaluator task."""
    model, history, directory = trained_chief
    copy = tmp_path / "ckpt"
    shutil.copytree(directory, copy)
    as_task(monkeypatch, "evaluator")
    return model, history, copy


def evaluator(directory, hidden: int = 16, **options):
    with hybridpar.scope(settings(directory, **options)) as hs:
        return hs, build(hidden)


def test_fit_on_the_evaluator_evaluates_every_checkpoint_as_the_chief_validated(
    chief, caplog, tensorboard_scalars
):
    trained, history, directory = chief
    assert end_record.read(directory)["step"] == 24
    hs, model = evaluator(directory)
    assert hs.is_evaluator and not hs.is_chief and hs.mode == "none"
    x, y, validation = data()
    with caplog.at_level(logging.INFO, "hybridpar"):
        evaluated = model.fit(x, y, epochs=EPOCHS, validation_data=validation, verbose=0)
    assert evaluated.history["step"] == [8, 16, 24]
    assert evaluated.epoch == [0, 1, 2] == history.epoch
    for name in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(evaluated.history[name], history.history[name], rtol=1e-6)
    assert "evaluated ckpt-00000016 (step 16, end of epoch 2; read " in caplog.text
    assert int(model.optimizer.iterations.numpy()) == 0  # weights only: nothing trained here
    assert tensorboard_scalars(directory / "evaluator") == {
        step: {"evaluation_loss_vs_iterations", "evaluation_accuracy_vs_iterations"}
        for step in (8, 16, 24)}
    chief_eval = trained.evaluate(validation, return_dict=True, verbose=0)
    assert model.evaluate(validation, return_dict=True, verbose=0) == pytest.approx(
        chief_eval, rel=1e-6)
    np.testing.assert_allclose(model.predict(x[:10], verbose=0),
                               trained.predict(x[:10], verbose=0), atol=1e-6)
    assert hs.output_dir(directory) == directory / "evaluator"


def test_evaluate_and_predict_follow_the_newest_checkpoint(chief):
    trained, _, directory = chief
    _, model = evaluator(directory)
    x, _, _ = data()
    first = model.predict(x[:4], verbose=0)
    later = build()  # a later state of the chief's model: the same weights, the bias moved
    later.set_weights(trained.get_weights())
    later.layers[-1].bias.assign(later.layers[-1].bias + 1.0)
    later.optimizer.build(later.trainable_variables)
    later.optimizer.iterations.assign(99)
    hybridpar.checkpoint.save(later, directory)
    np.testing.assert_allclose(model.predict(x[:4], verbose=0), first + 1.0, atol=1e-5)
    np.testing.assert_allclose(model.layers[-1].bias.numpy(), later.layers[-1].bias.numpy())


def test_a_damaged_checkpoint_is_skipped_and_the_rest_evaluated(chief, caplog):
    _, history, directory = chief
    state = directory / "ckpt-00000016" / "state.data-00000-of-00001"
    state.write_bytes(state.read_bytes()[:100])
    _, model = evaluator(directory)
    x, y, validation = data()
    with caplog.at_level(logging.INFO, "hybridpar"):
        evaluated = model.fit(x, y, epochs=EPOCHS, validation_data=validation, verbose=0)
    assert evaluated.history["step"] == [8, 24]
    assert "checkpoint ckpt-00000016 is damaged" in caplog.text
    assert "the evaluator skips it" in caplog.text
    assert evaluated.history["val_loss"][-1] == pytest.approx(history.history["val_loss"][-1])


def test_an_unbuilt_subclassed_model_is_built_from_the_validation_data(chief):
    _, history, directory = chief

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    with hybridpar.scope(settings(directory)):
        model = Subclassed()
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _, _, validation = data()
    evaluated = model.fit(None, epochs=EPOCHS, validation_data=validation, verbose=0)
    np.testing.assert_allclose(evaluated.history["val_loss"], history.history["val_loss"],
                               rtol=1e-6)


def test_fit_on_the_evaluator_needs_validation_data(chief):
    _, model = evaluator(chief[2])
    with pytest.raises(ConfigError, match=r"model.fit on evaluator:0 \(the cluster's evaluator\) "
                                          r"evaluates each checkpoint.*Received: "
                                          r"validation_data=None"):
        model.fit(np.zeros((4, 8)), np.zeros(4), epochs=EPOCHS)


def test_the_evaluator_needs_checkpoint_dir(monkeypatch):
    as_task(monkeypatch, "evaluator")
    with pytest.raises(ConfigError, match="checkpoint.dir is not set"):
        hybridpar.scope({"data_parallel": {"mode": "none"}}).__enter__()


def test_a_checkpoint_dir_that_is_not_a_directory_fails_before_waiting(tmp_path, monkeypatch):
    as_task(monkeypatch, "evaluator")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    _, model = evaluator(blocker / "ckpt", timeout_seconds=None)  # would wait forever
    _, _, validation = data()
    with pytest.raises(ConfigError, match=r"checkpoint.dir='.*a_file/ckpt', but .*a_file is "
                                          r"not a directory"):
        model.fit(None, epochs=1, validation_data=validation)


def test_no_checkpoint_within_the_timeout_is_an_error(tmp_path, monkeypatch):
    as_task(monkeypatch, "evaluator")
    _, model = evaluator(tmp_path / "empty", timeout_seconds=0.3)
    _, _, validation = data()
    with pytest.raises(TimeoutError, match=r"No new checkpoint appeared in .*empty for 0.3 s"):
        model.fit(None, epochs=1, validation_data=validation)


def test_a_checkpoint_of_another_model_is_refused(chief):
    _, model = evaluator(chief[2], hidden=4)
    _, _, validation = data()
    with pytest.raises(CheckpointMismatchError, match="written by a different model"):
        model.fit(None, epochs=EPOCHS, validation_data=validation, verbose=0)

"""fit's training input saved with the checkpoints (hybridpar.data.resumable): a resume
restores the iterator instead of drawing the batches already trained again."""

import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import Crash, max_weight_difference

import hybridpar
from hybridpar.data import resumable

pytestmark = pytest.mark.strategy

EPOCHS = 3
BATCH = 16
EXAMPLES = 194  # 13 batches per epoch, the last of 2 examples: fewer than 4 replicas


def features(examples: int = EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(examples, 8)).astype("float32"),
            rng.normal(size=(examples, 2)).astype("float32"))


def reshuffling() -> tf.data.Dataset:
    """A new order every epoch (reshuffle_each_iteration=True), from the seed."""
    data = tf.data.Dataset.from_tensor_slices(features())
    return data.shuffle(EXAMPLES, seed=1).batch(BATCH).prefetch(2)


def generated() -> tf.data.Dataset:
    """The same batches from a Python generator, whose position cannot be saved."""
    x, y = features()

    def examples():
        yield from zip(x, y, strict=True)

    signature = (tf.TensorSpec([8], tf.float32), tf.TensorSpec([2], tf.float32))
    return tf.data.Dataset.from_generator(examples, output_signature=signature).batch(BATCH)


def arrays():
    """In-memory arrays, which Keras's fit shuffles (shuffle=True) with a stateful op."""
    return features()


def train(directory, data, mode="none", crash_at=None, steps_per_execution=1, **checkpoint):
    keras.utils.set_random_seed(3)
    config = {"data_parallel": {"mode": mode}, "data": {"global_batch_size": BATCH},
              "checkpoint": {"dir": str(directory), "every_steps": 4, **checkpoint}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(0.01), "mse",
                      steps_per_execution=steps_per_execution)
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    inputs = data()
    x, y = inputs if isinstance(inputs, tuple) else (inputs, None)
    try:
        model.fit(x, y, batch_size=BATCH if y is not None else None, epochs=EPOCHS,
                  callbacks=callbacks + extra, verbose=0)
    finally:
        callbacks[0].writer.wait()
    return model, callbacks[0]


def weights(model: keras.Model) -> list[np.ndarray]:
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


@pytest.mark.parametrize("mode, steps_per_execution", [
    ("none", 1), ("mirrored", 1), ("mirrored", 2),
])
def test_a_reshuffling_input_resumes_like_the_uninterrupted_run(
    mode, steps_per_execution, tmp_path, caplog
):
    """Drawing the trained batches again would meet another order (a fresh iterator draws
    another shuffle in a new run); the restored iterator continues the saved one's, and the
    later epochs draw the orders of the uninterrupted run (the iterator's state holds its
    shuffle's seed generator)."""
    reference, _ = train(tmp_path / "reference", reshuffling, mode,
                         steps_per_execution=steps_per_execution)
    # Saves every 3 steps reach the middle epoch (steps 14 to 26) with 2 steps per call too.
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", reshuffling, mode, crash_at=23,
              steps_per_execution=steps_per_execution, every_steps=3)
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        resumed, callback = train(tmp_path / "resumed", reshuffling, mode,
                                  steps_per_execution=steps_per_execution, every_steps=3)
    assert callback.restored.step == 21
    assert callback.restored.manifest["data"]["batch"] == 8
    assert "restored the training input's position from the checkpoint" in caplog.text
    assert "are drawn again" not in caplog.text
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 13
    assert max_weight_difference(weights(resumed), weights(reference)) <= 1e-5


def test_keras_shuffle_of_arrays_resumes_inside_its_epoch_in_the_saved_order(tmp_path, caplog):
    """The order Keras's fit draws for in-memory arrays comes from a stateful random op: the
    iterator is saved without that op's state, said once, and the resumed epoch continues
    in its saved order."""
    reference, _ = train(tmp_path / "reference", arrays, "mirrored")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridpar"), pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", arrays, "mirrored", crash_at=34)
    said = [r.getMessage() for r in caplog.records if "without the state" in r.getMessage()]
    assert len(said) == 1 and "RandomShuffle is stateful" in said[0]
    resumed, callback = train(tmp_path / "resumed", arrays, "mirrored")
    assert callback.restored.step == 32
    assert max_weight_difference(weights(resumed), weights(reference)) <= 1e-5


def test_upstream_drawing_a_reshuffling_input_again_trains_on_other_batches(tmp_path):
    """Why the iterator is saved: with checkpoint.save_iterator false (TensorFlow's
    distributed iterator) the resumed epoch is drawn again in another order."""
    reference, _ = train(tmp_path / "reference", reshuffling, "mirrored", save_iterator=False)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", reshuffling, "mirrored", crash_at=34, save_iterator=False)
    resumed, callback = train(tmp_path / "resumed", reshuffling, "mirrored",
                              save_iterator=False)
    assert callback.restored.step == 32
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 13
    assert max_weight_difference(weights(resumed), weights(reference)) > 1e-3


def test_the_resumable_input_feeds_the_replicas_what_the_distributed_iterator_does(tmp_path):
    """The same pieces (a last batch of 2 over 4 replicas, padded) and the same weights,
    with and without the saved iterator, and one device's weights."""
    saved, _ = train(tmp_path / "saved", reshuffling, "mirrored")
    distributed, _ = train(tmp_path / "distributed", reshuffling, "mirrored",
                           save_iterator=False)
    single, _ = train(tmp_path / "single", reshuffling, "none", save_iterator=False)
    assert max_weight_difference(weights(saved), weights(distributed)) <= 1e-6
    assert max_weight_difference(weights(saved), weights(single)) <= 1e-5


class Inputs(keras.callbacks.Callback):
    """Records the type of the iterator each train_function call receives."""

    def __init__(self) -> None:
        super().__init__()
        self.types: list[type] = []

    def on_train_begin(self, logs=None):
        original = self.model.train_function

        def recording(iterator):
            self.types.append(type(iterator))
            return original(iterator)

        self.model.train_function = recording


def test_fit_reads_a_resumable_iterator_only_with_a_callback_that_saves_it(tmp_path, caplog):
    config = {"data_parallel": {"mode": "mirrored"}, "data": {"global_batch_size": BATCH},
              "checkpoint": {"dir": str(tmp_path), "every_steps": 4}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        callbacks = hs.callbacks()
    with_checkpoints, without = Inputs(), Inputs()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model.fit(reshuffling().take(4), epochs=1, callbacks=[*callbacks, with_checkpoints],
                  validation_data=reshuffling().take(1), verbose=0)
    said = re.findall(r"the training input's position with its buffers: ([\d,]+) bytes",
                      caplog.text)
    assert len(said) == 1 and int(said[0].replace(",", "")) > 0  # the first save says it
    model.fit(reshuffling().take(2), epochs=1, callbacks=[without], verbose=0)
    assert with_checkpoints.types == [resumable.ResumableIterator] * 4
    assert len(without.types) == 2
    assert all(issubclass(t, tf.distribute.DistributedIterator) for t in without.types)


def test_a_generator_input_is_drawn_again_and_said_once(tmp_path, caplog):
    reference, _ = train(tmp_path / "reference", generated, "mirrored")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridpar"), pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", generated, "mirrored", crash_at=19)
    warnings = [r.getMessage() for r in caplog.records
                if "position cannot be saved" in r.getMessage()]
    assert len(warnings) == 1  # 4 saves, said once
    assert "PyFunc is stateful" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        resumed, callback = train(tmp_path / "resumed", generated, "mirrored")
    assert "input_state" not in callback.restored.manifest["data"]
    assert ("the batches already trained are drawn again: the checkpoint holds no state of "
            "the input's iterator") in caplog.text
    assert max_weight_difference(weights(resumed), weights(reference)) <= 1e-5


def test_a_checkpoint_of_another_topology_draws_the_batches_again(tmp_path, caplog):
    with pytest.raises(KeyboardInterrupt):  # one device writes steps 4..16
        train(tmp_path / "resumed", reshuffling, "none", crash_at=19)
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        train(tmp_path / "resumed", reshuffling, "mirrored")
    assert ("its input's state was saved for 1 worker(s) x 1 replica(s)" in caplog.text
            and "this fit reads 1 worker(s) x 4 replica(s)" in caplog.text)


def test_batches_that_divide_keep_their_static_shape(tmp_path):
    """drop_remainder batches of 16 over 4 replicas: pieces of exactly 4, as TensorFlow's
    rebatching gives them, so a model built for a fixed batch of 4 trains as before."""
    def run(save_iterator):
        keras.utils.set_random_seed(3)
        config = {"data_parallel": {"mode": "mirrored"}, "data": {"global_batch_size": BATCH},
                  "checkpoint": {"dir": str(tmp_path / str(save_iterator)), "every_steps": 4,
                                 "save_iterator": save_iterator}}
        with hybridpar.scope(config) as hs:
            model = keras.Sequential([keras.Input((8,), batch_size=4), keras.layers.Dense(2)])
            model.compile(keras.optimizers.Adam(0.01), "mse")
        inputs = Inputs()
        data = tf.data.Dataset.from_tensor_slices(features()).batch(BATCH, drop_remainder=True)
        model.fit(data, epochs=2, callbacks=[*hs.callbacks(), inputs], verbose=0)
        return model, inputs.types

    saved, types = run(True)
    distributed, _ = run(False)
    assert set(types) == {resumable.ResumableIterator}
    assert max_weight_difference(weights(saved), weights(distributed)) <= 1e-6

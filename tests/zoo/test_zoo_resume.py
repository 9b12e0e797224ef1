"""Zoo models resumed from hybridpar's checkpoints under ``mirrored`` on the 4 logical CPUs.

A crash inside the second of three epochs, then the same script run again: ``fit``
restores the newest checkpoint with its input position (a reshuffling ``tf.data``
pipeline whose final batch of 2 leaves two replicas padded) and ends with the weights,
batch-norm statistics and optimizer state of the uninterrupted run.
"""

from __future__ import annotations

import logging

import keras
import pytest
import tensorflow as tf
import zoo_models  # beside this file
from model_checks import Crash, max_weight_difference
from zoo_models import BATCH, EXAMPLES, MODELS

import hybridpar

pytestmark = [pytest.mark.zoo, pytest.mark.strategy, pytest.mark.slow]

EPOCHS = 3  # 3 steps each (16, 16 and 2 examples): 9 steps
CRASH_AT = 5  # the second step of epoch 2; the newest checkpoint is step 4


def reshuffling(zoo: zoo_models.ZooModel) -> tf.data.Dataset:
    x, y, _ = zoo.data(EXAMPLES)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return data.shuffle(EXAMPLES, seed=5).batch(BATCH)


def train(zoo: zoo_models.ZooModel, directory, crash_at: int | None = None):
    keras.utils.set_random_seed(11)
    config = {"data_parallel": {"mode": "mirrored"}, "data": {"global_batch_size": BATCH},
              "checkpoint": {"dir": str(directory), "every_steps": 2}}
    with hybridpar.scope(config) as hs:
        model = zoo.build()
        model.compile(**zoo.compile_kwargs())
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    try:
        model.fit(reshuffling(zoo), epochs=EPOCHS, callbacks=callbacks + extra, verbose=0)
    finally:  # a crash leaves the write in flight running, as at exit
        callbacks[0].writer.wait()
    return model, callbacks[0]


def state(model: keras.Model) -> list:
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


@pytest.mark.parametrize("name", [
    pytest.param("MobileNetV2", marks=pytest.mark.zoo_heavy),  # over 2 minutes
    "BertTextClassifier"])
def test_a_crashed_run_resumes_to_the_uninterrupted_weights(name, tmp_path, caplog):
    zoo = MODELS[name]
    reference, _ = train(zoo, tmp_path / "reference")
    with pytest.raises(KeyboardInterrupt):
        train(zoo, tmp_path / "resumed", crash_at=CRASH_AT)
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        resumed, callback = train(zoo, tmp_path / "resumed")
    assert callback.restored.step == 4
    assert callback.restored.manifest["data"]["epoch"] == 1
    assert callback.restored.manifest["data"]["batch"] == 1
    assert "restored the training input's position from the checkpoint" in caplog.text
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 3
    assert max_weight_difference(state(resumed), state(reference)) <= 1e-5
    figures = resumed.evaluate(reshuffling(zoo), verbose=0, return_dict=True)
    assert figures == pytest.approx(reference.evaluate(reshuffling(zoo), verbose=0,
                                                       return_dict=True), abs=1e-5)

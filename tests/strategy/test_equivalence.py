"""Distributed training equals single-device training on the same data and seed."""

import hybridpar_models
import keras
import numpy as np
import pytest
import tensorflow as tf

import hybridpar

pytestmark = pytest.mark.strategy

GLOBAL_BATCH = 64
EPOCHS = 3


def train_weights(config: dict, data_dir: str) -> tuple[list[np.ndarray], list[float]]:
    """Trains digits_mlp with SGD; returns final weights and per-epoch losses."""
    keras.utils.set_random_seed(7)
    with hybridpar.scope(config):
        dataset = (
            hybridpar.data.load_tfds("hybridpar_digits", "train", data_dir, as_supervised=True)
            .shuffle(2048, seed=3)
            .batch(GLOBAL_BATCH)
        )
        model = hybridpar_models.get("digits_mlp")()
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(dataset, epochs=EPOCHS, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()], history.history["loss"]


def test_mirrored_over_4_cpus_equals_single_device(digits_data_dir):
    batch = {"global_batch_size": GLOBAL_BATCH}
    single, single_loss = train_weights(
        {"data_parallel": {"mode": "none"}, "data": batch}, digits_data_dir
    )
    mirrored, mirrored_loss = train_weights(
        {"data_parallel": {"mode": "mirrored"}, "data": batch}, digits_data_dir
    )
    assert tf.config.list_logical_devices("CPU")[3]  # really 4 replicas
    max_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(single, mirrored, strict=True))
    assert max_diff <= 1e-5, f"max abs weight difference {max_diff:.3g}"
    np.testing.assert_allclose(mirrored_loss, single_loss, rtol=1e-5)
    assert single_loss[-1] < single_loss[0]  # it did learn

"""Reading a tf.data pipeline's batching (hybridpar.data.inspect), and training on what it reads."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters import array_data_adapter

import hybridpar
from hybridpar.data.inspect import is_batched, static_batch_size

X = np.zeros((10, 4), "float32")


def slices() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(X)


@pytest.mark.parametrize(
    "make, batched",
    [
        (lambda d: slices(), False),
        (lambda d: slices().batch(2), True),
        (lambda d: slices().batch(2).map(lambda a: a * 2).prefetch(1), True),
        (lambda d: slices().shuffle(3).map(lambda a: a).cache(), False),
        (lambda d: slices().batch(2).unbatch(), False),
        (lambda d: tf.data.Dataset.range(5).map(lambda i: tf.zeros((4,))), False),
        (lambda d: tf.data.Dataset.from_tensors(X), True),
        (lambda d: hybridpar.data.load_tfds("hybridpar_digits", "train", d), False),
        (lambda d: hybridpar.data.load_tfds("hybridpar_digits", "train", d).batch(8), True),
        (lambda d: tf.data.Dataset.from_tensor_slices(
            hybridpar.data.dataset_files("hybridpar_digits", "train", d)).interleave(
            tf.data.TFRecordDataset), False),
        (lambda d: tf.data.Dataset.from_tensor_slices(
            hybridpar.data.dataset_files("hybridpar_digits", "train", d)).interleave(
            lambda f: tf.data.TFRecordDataset(f).batch(4)), True),
        (lambda d: array_data_adapter.ArrayDataAdapter(X, batch_size=4).get_tf_dataset(), True),
    ],
    ids=["slices", "batch", "batch-map-prefetch", "shuffle-map-cache", "unbatch", "range-map",
         "from_tensors", "tfds", "tfds-batch", "file-interleave", "file-interleave-batch",
         "keras-arrays"],
)
def test_is_batched(make, batched, digits_data_dir):
    assert is_batched(make(digits_data_dir)) is batched


def test_static_batch_size():
    assert static_batch_size(slices().batch(5, drop_remainder=True)) == 5
    assert static_batch_size(slices().batch(5)) is None


@pytest.mark.slow
def test_an_unbatched_dataset_over_2_gb_is_batched_and_trains():
    """Serializing this dataset's graph fails past protobuf's 2 GB and used to read as batched."""
    rows = 2**31 // 4096 + 20_000  # 2.2 GB of float32 rows of 1024
    features = tf.ones((rows, 1024))  # made by TensorFlow: one copy, no numpy one beside it
    options = tf.data.Options()  # tf.data's own graph rewrites would copy the 2.2 GB in C++
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    options.experimental_warm_start = False
    dataset = tf.data.Dataset.from_tensor_slices((features, tf.zeros((rows, 1))))
    dataset = dataset.with_options(options)
    assert not is_batched(dataset)
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}, "data": {"global_batch_size": 8}}):
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    steps = []
    history = model.fit(dataset, steps_per_epoch=2, shuffle=False, verbose=0, callbacks=[
        keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: steps.append(step))])
    replicas = model.distribute_strategy.num_replicas_in_sync
    iterations = int(model.optimizer.iterations.numpy())
    loss = history.history["loss"]
    del dataset, features, model, history
    gc.collect()
    assert (replicas, iterations, steps, len(loss)) == (4, 2, [0, 1], 1)
    assert np.isfinite(loss[0])

"""Reading a tf.data pipeline's batching from its graph (hybridpar.data.inspect)."""

import keras  # noqa: F401  (Keras's array adapter below)
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

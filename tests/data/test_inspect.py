"""What hybridpar.data.inspect reads of tf.data pipelines, and that it never serializes them."""

from __future__ import annotations

import contextlib
import pathlib
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters import array_data_adapter
from tensorflow.python.data.ops import dataset_ops

import hybridpar
from hybridpar.data import dataset_structure, inspect

X = np.zeros((10, 4), "float32")
RECORD_FILES = 3


class Sources(NamedTuple):
    records: list[str]
    texts: list[str]
    saved: str
    tfds_dir: str


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, digits_data_dir: str) -> Sources:
    """TFRecord and text files, a saved dataset, and the tfds digits directory."""
    root = tmp_path_factory.mktemp("inspect")
    records, texts = [], []
    for i in range(RECORD_FILES):
        records.append(str(root / f"part-{i}.tfrecord"))
        with tf.io.TFRecordWriter(records[-1]) as writer:
            writer.write(b"record")
        texts.append(str(root / f"part-{i}.txt"))
        pathlib.Path(texts[-1]).write_text("a\nb\n")
    saved = str(root / "saved")
    slices().save(saved)
    return Sources(records, texts, saved, digits_data_dir)


@contextlib.contextmanager
def serialization_forbidden() -> Iterator[None]:
    """Makes ``_as_serialized_graph`` fail on every dataset while inspecting."""

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__}._as_serialized_graph was called")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dataset_ops.DatasetV2, "_as_serialized_graph", refuse)
        yield


def answers(dataset: Any) -> tuple[bool, int | None, list[str]]:
    with serialization_forbidden():
        return (inspect.is_batched(dataset), inspect.input_files(dataset),
                inspect.python_ops(dataset))


def slices() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(X)


def generator() -> Iterator[np.ndarray]:
    yield from X


@tf.function
def numpy_in_tf_function(x: tf.Tensor) -> tf.Tensor:
    return tf.numpy_function(lambda a: a, [x], tf.float32)


def options() -> tf.data.Options:
    result = tf.data.Options()
    result.experimental_deterministic = False
    return result


def every_keeping_transformation(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return (dataset.with_options(options()).prefetch(1).cache().shuffle(3).repeat().take(4)
            .map(lambda a: a * 2, num_parallel_calls=2).filter(lambda a: True).skip(0))


def sequences() -> tf.data.Dataset:
    return tf.data.Dataset.range(1, 9).map(lambda n: tf.zeros([n]))


def bucketed() -> tf.data.Dataset:
    return sequences().bucket_by_sequence_length(lambda e: tf.shape(e)[0], [3, 6], [2, 2, 2])


def tfds(s: Sources) -> tf.data.Dataset:
    return hybridpar.data.load_tfds("hybridpar_digits", "train", s.tfds_dir)


Make = Callable[[Sources], Any]
NONE: list[str] = []
CASES: dict[str, tuple[Make, bool, int | None, list[str]]] = {
    "slices": (lambda s: slices(), False, None, NONE),
    "range": (lambda s: tf.data.Dataset.range(5), False, None, NONE),
    "keeping-chain": (lambda s: every_keeping_transformation(slices()), False, None, NONE),
    "batch-keeping-chain": (lambda s: every_keeping_transformation(slices().batch(2)), True,
                            None, NONE),
    "padded_batch": (lambda s: sequences().padded_batch(2), True, None, NONE),
    "ragged_batch": (lambda s: sequences().ragged_batch(2), True, None, NONE),
    "bucket_by_sequence_length": (lambda s: bucketed(), True, None, NONE),
    "bucket-unbatch": (lambda s: bucketed().unbatch(), False, None, NONE),
    "unbatch": (lambda s: slices().batch(2).unbatch(), False, None, NONE),
    "rebatch": (lambda s: slices().batch(4).rebatch(2), True, None, NONE),
    "map_and_batch": (lambda s: slices().apply(
        tf.data.experimental.map_and_batch(lambda a: a, 2)), True, None, NONE),
    "zip": (lambda s: tf.data.Dataset.zip((slices(), slices())), True, None, NONE),
    "from_tensors": (lambda s: tf.data.Dataset.from_tensors(X), True, None, NONE),
    "from_generator": (lambda s: tf.data.Dataset.from_generator(
        generator, output_signature=tf.TensorSpec([4], tf.float32)), True, None, ["PyFunc"]),
    "py_function-map": (lambda s: slices().map(
        lambda a: tf.py_function(lambda b: b, [a], tf.float32)), False, None, ["EagerPyFunc"]),
    "numpy_function-in-tf.function": (lambda s: slices().map(numpy_in_tf_function), False, None,
                                      ["PyFunc"]),
    "tfrecord-interleave": (lambda s: tf.data.Dataset.from_tensor_slices(s.records).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=2), False, RECORD_FILES, NONE),
    "tfrecord-interleave-batch": (lambda s: tf.data.Dataset.from_tensor_slices(s.records)
                                  .interleave(lambda f: tf.data.TFRecordDataset(f).batch(4)),
                                  True, RECORD_FILES, NONE),
    "tfrecord-reader": (lambda s: tf.data.TFRecordDataset(s.records), False, RECORD_FILES, NONE),
    "tfrecord-parallel-reads": (lambda s: tf.data.TFRecordDataset(
        s.records, num_parallel_reads=2), False, RECORD_FILES, NONE),
    "textline-interleave": (lambda s: tf.data.Dataset.from_tensor_slices(s.texts).interleave(
        tf.data.TextLineDataset), False, RECORD_FILES, NONE),
    "textline-one-file-batch": (lambda s: tf.data.TextLineDataset(s.texts[0]).batch(2), True, 1,
                                NONE),
    "load": (lambda s: tf.data.Dataset.load(s.saved), True, None, NONE),
    "tfds": (lambda s: tfds(s), False, 8, NONE),
    "tfds-map-batch": (lambda s: tfds(s).map(lambda e: e).shuffle(8).batch(8).prefetch(1), True,
                       8, NONE),
    "unknown-class": (lambda s: tf.data.experimental.from_variant(
        tf.data.experimental.to_variant(slices()), slices().element_spec), True, None, NONE),
    "keras-arrays": (lambda s: array_data_adapter.ArrayDataAdapter(
        X, batch_size=4).get_tf_dataset(), True, None, NONE),
    "distributed": (lambda s: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                    .experimental_distribute_dataset(slices().batch(4)), True, None, NONE),
    "distributed-from-function": (lambda s: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                                  .distribute_datasets_from_function(lambda _: slices()), False,
                                  None, NONE),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_answers_without_serializing(case: str, sources: Sources):
    make, batched, files, python = CASES[case]
    assert answers(make(sources)) == (batched, files, python)


def test_a_dataset_built_in_a_tf_function_is_read_from_its_ops(sources: Sources):
    found = {}

    @tf.function
    def build() -> tf.Tensor:
        found["python"] = answers(slices().map(
            lambda a: tf.py_function(lambda b: b, [a], tf.float32)).batch(2))
        found["records"] = answers(tf.data.Dataset.from_tensor_slices(sources.records)
                                   .interleave(tf.data.TFRecordDataset).prefetch(1))
        return tf.constant(0)

    build.get_concrete_function()
    assert found == {"python": (True, None, ["EagerPyFunc"]),
                     "records": (False, RECORD_FILES, NONE)}


def test_static_batch_size():
    assert inspect.static_batch_size(slices().batch(5, drop_remainder=True)) == 5
    assert inspect.static_batch_size(slices().batch(5)) is None
    assert inspect.static_batch_size(sequences().padded_batch(2, drop_remainder=True)) == 2
    assert inspect.static_batch_size(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                                     .experimental_distribute_dataset(
                                         slices().batch(4, drop_remainder=True))) == 4


def test_something_else_is_refused_with_what_was_received():
    with pytest.raises(TypeError, match=r"reads a tf.data.Dataset .* Received: ndarray"):
        inspect.is_batched(X)


def big_pipeline(rows: int) -> tf.data.Dataset:
    """In-memory data (``rows`` x 4 KB) in the source and captured by a map."""
    data = tf.zeros((rows, 1024))
    return (tf.data.Dataset.from_tensor_slices((data, tf.zeros((rows,))))
            .map(lambda a, b: (a * data[0], b)).shuffle(4).batch(2).prefetch(1))


def test_inspection_does_not_grow_with_the_data():
    """Serializing would copy the 64 MB twice (source and capture) into one bytes object;
    the walk allocates the same few KB for 1 row as for 16384."""
    small, big = big_pipeline(1), big_pipeline(16384)
    assert dataset_structure.contents(small) == dataset_structure.contents(big)
    peaks = []
    for dataset in (small, big):
        tracemalloc.start()
        try:
            assert answers(dataset) == (True, None, NONE)
            assert inspect.static_batch_size(dataset) is None
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 2**20 and peaks[1] < 2 * peaks[0] + 2**16, peaks

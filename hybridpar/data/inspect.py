"""What a tf.data pipeline is, read from its structure without reading any data.

hybridpar batches datasets of single examples itself and leaves batched ones
alone, splits global batches over replicas evenly, shards file-based input by
file, and refuses to send Python-backed datasets to parameter-server
workers; each needs to know something of the pipeline: whether and how it
is batched, how many files it reads, which Python ops it runs.

The answers come from ``hybridpar.data.dataset_structure`` (the dataset
objects and their traced functions), never from serializing the dataset, so
they cost the same for a dataset of 2 KB or 2 GB held in memory. Every
function takes a ``tf.data.Dataset`` or a ``tf.distribute`` distributed
dataset (whose underlying dataset is read).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hybridpar.data import dataset_structure

# Stage kinds are matched by prefix: an eager dataset's class (``BatchDataset``
# for ``_BatchDataset``) or a graph op's type (``BatchDatasetV2``).
_BATCHING = ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset",
             "MapAndBatchDataset", "RebatchDataset", "LegacyRebatchDataset",
             "DenseToSparseBatchDataset")
_EXAMPLE_SOURCES = ("UnbatchDataset", "TensorSliceDataset", "RangeDataset", "TFRecordDataset",
                    "TextLineDataset", "FixedLengthRecordDataset", "SparseTensorSliceDataset")
_PASSTHROUGH = ("MapDataset", "ParallelMapDataset", "PrefetchDataset", "CacheDataset",
                "MemoryCacheDataset", "RepeatDataset", "ShuffleDataset",
                "ShuffleAndRepeatDataset", "TakeDataset", "SkipDataset", "FilterDataset",
                "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
                "PrivateThreadPoolDataset", "AssertCardinalityDataset", "ShardDataset",
                "AutoShardDataset", "IgnoreErrorsDataset", "AssertNextDataset",
                "RestructuredDataset", "DenseToRaggedDataset", "DatasetV1Adapter", "Identity")
_NESTING = ("InterleaveDataset", "ParallelInterleaveDataset", "LegacyParallelInterleaveDataset",
            "FlatMapDataset", "GroupByWindowDataset")
_READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
            "ArrayRecordDataset")
_PYTHON_OPS = ("PyFunc", "EagerPyFunc", "PyFuncStateless")


def _dataset(value: Any) -> tf.data.Dataset:
    dataset = dataset_structure.underlying_dataset(value)
    if dataset is None:
        raise TypeError(
            "hybridpar.data.inspect reads a tf.data.Dataset or a tf.distribute distributed "
            f"dataset. Received: {type(value).__name__}.")
    return dataset


def input_files(dataset: Any) -> int | None:
    """How many files a dataset reads, or ``None`` when it reads none.

    A dataset reads files when it or one of its functions is a record/text
    file reader; their number is the length of the longest vector of strings
    (file names) the pipeline holds, or 1 if it holds none.
    """
    found = dataset_structure.contents(_dataset(dataset))
    if not any(kind.startswith(_READERS) for kind in found.kinds):
        return None
    return max(found.string_vectors, default=1)


def python_ops(dataset: Any) -> list[str]:
    """The Python-calling ops (``from_generator``, ``py_function``) a dataset runs."""
    return sorted(set(dataset_structure.contents(_dataset(dataset)).kinds) & set(_PYTHON_OPS))


def is_batched(dataset: Any) -> bool:
    """True when the dataset yields batches rather than single examples.

    Walks from the output back through transformations that keep the element
    shape (map, prefetch, cache, shuffle, ..., and any eager dataset class
    that keeps its input's element structure) to the one that made the
    elements: a batch means batched; a source of single examples (tensor
    slices, a range, record files, ``unbatch``) means unbatched; an
    interleave/flat_map/group_by_window is judged by the dataset its function
    returns (tfds's file interleave yields examples; bucket_by_sequence_length
    batches). Anything else (zip, a generator, ``from_tensors``,
    ``Dataset.load``, a dataset class this walk does not know, a function
    returning a dataset it was given) counts as batched, so hybridpar never
    batches a dataset a second time.
    """
    stage: dataset_structure.Stage | None = dataset_structure.output_stage(_dataset(dataset))
    while stage is not None:
        if stage.kind.startswith(_BATCHING):
            return True
        if stage.kind.startswith(_EXAMPLE_SOURCES):
            return False
        if stage.kind.startswith(_NESTING):
            stage = stage.returned()
        elif stage.kind.startswith(_PASSTHROUGH) or stage.keeps_structure:
            stage = stage.upstream()
        else:
            return True
    return True


def static_batch_size(dataset: Any) -> int | None:
    """The batch size when every element has the same static leading size."""
    sizes = {
        spec.shape[0] if getattr(spec, "shape", None) is not None and spec.shape.rank else None
        for spec in tf.nest.flatten(_dataset(dataset).element_spec)
    }
    return sizes.pop() if len(sizes) == 1 else None

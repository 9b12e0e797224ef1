"""How global batches reach the replicas.

``tf.distribute`` splits a batched dataset into per-replica batches of fixed
size, front first: a final partial batch of 92 examples over 4 replicas of 32
becomes 32, 32, 28 and 0. A replica with no examples is harmful: oneDNN's
fused convolution returns a wrongly shaped result for an empty batch (the
next layer then fails with "input depth must be evenly divisible by filter
depth"), and batch statistics of zero examples are NaN. hybridpar instead
splits every global batch evenly (92 -> 23, 23, 23, 23), so replicas differ
by at most one example. Only a final batch with fewer examples than replicas
still leaves some replicas empty; no example is ever dropped.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def _first_tensor(element: Any) -> tf.Tensor:
    return tf.nest.flatten(element)[0]


_BATCHING_OPS = ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset",
                 "MapAndBatchDataset", "RebatchDataset", "BucketBySequenceLength")
_EXAMPLE_SOURCES = ("UnbatchDataset", "TensorSliceDataset", "RangeDataset", "TFRecordDataset",
                    "TextLineDataset", "FixedLengthRecordDataset", "SparseTensorSliceDataset")
_PASSTHROUGH = ("MapDataset", "ParallelMapDataset", "PrefetchDataset", "CacheDataset",
                "MemoryCacheDataset", "RepeatDataset", "ShuffleDataset",
                "ShuffleAndRepeatDataset", "TakeDataset", "SkipDataset", "FilterDataset",
                "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
                "PrivateThreadPoolDataset", "AssertCardinalityDataset", "ShardDataset",
                "AutoShardDataset", "IgnoreErrorsDataset", "AssertNextDataset")
_NESTING = ("InterleaveDataset", "ParallelInterleaveDataset", "FlatMapDataset")


def dataset_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
    """The dataset's serialized graph (cheap; nothing is read)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())
    return graph


def is_batched(dataset: tf.data.Dataset) -> bool:
    """True when the dataset yields batches rather than single examples.

    Walks from the output back through ops that keep the element shape (map,
    prefetch, cache, shuffle, ...) to the op that made the elements: a batch
    op means batched; a source of single examples (tensor slices, a range,
    record files, ``unbatch``) means unbatched; an interleave/flat_map is
    judged by what its function returns (tfds's file interleave yields
    examples). Anything else (zip, a generator, ``from_tensors``) counts as
    batched, so hybridpar never batches a dataset a second time.
    """
    graph = dataset_graph(dataset)
    functions = {f.signature.name: f for f in graph.library.function}
    nodes = {node.name: node for node in graph.node}
    node = next((n for n in nodes.values() if n.op == "_Retval"), None)
    while node is not None and node.input:
        node = nodes.get(node.input[0].split(":")[0].lstrip("^"))
        if node is None or node.op.startswith(_BATCHING_OPS):
            return True
        if node.op.startswith(_EXAMPLE_SOURCES):
            return False
        if node.op.startswith(_NESTING):
            inner = functions.get(node.attr["f"].func.name)
            ops = [n.op for n in inner.node_def] if inner is not None else []
            return not (ops and not any(o.startswith(_BATCHING_OPS) for o in ops)
                        and any(o.startswith(_EXAMPLE_SOURCES) for o in ops))
        if not node.op.startswith(_PASSTHROUGH):
            return True
    return True


def split_batches_evenly(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """Turns a dataset of global batches into consecutive per-replica batches.

    Each global batch becomes ``replicas`` batches whose sizes differ by at
    most one, in order (replica 0 gets the first examples).

    Args:
        dataset: a batched dataset.
        replicas: replicas that consume one global batch together.

    Returns:
        A dataset with ``replicas`` elements per global batch.
    """

    def split(*element: Any) -> tf.data.Dataset:
        batch = element[0] if len(element) == 1 else element
        size = tf.shape(_first_tensor(batch), out_type=tf.int64)[0]
        sizes = size // replicas + tf.cast(tf.range(replicas, dtype=tf.int64) < size % replicas,
                                          tf.int64)
        starts = tf.cumsum(sizes, exclusive=True)

        def take(index: tf.Tensor) -> Any:
            return tf.nest.map_structure(
                lambda t: t[starts[index] : starts[index] + sizes[index]], batch
            )

        return tf.data.Dataset.range(replicas).map(take)

    return dataset.flat_map(split)


def distribute_evenly(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    options: tf.distribute.InputOptions | None = None,
    *,
    fallback: Any,
) -> Any:
    """``experimental_distribute_dataset`` with even per-replica splits.

    Args:
        strategy: a single-worker strategy with several replicas.
        dataset: the user's dataset of global batches.
        options: passed on to TensorFlow.
        fallback: the strategy's own ``experimental_distribute_dataset``, used
            for unbatched datasets (TensorFlow then raises its usual error).
    """
    replicas = strategy.num_replicas_in_sync
    if replicas == 1 or not isinstance(dataset, tf.data.Dataset) or not is_batched(dataset):
        return fallback(dataset, options)
    per_replica = split_batches_evenly(dataset, replicas)
    return strategy.distribute_datasets_from_function(lambda _: per_replica, options)

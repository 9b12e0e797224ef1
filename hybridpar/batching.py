"""What a tf.data pipeline yields, read from its graph without reading data.

hybridpar batches datasets of single examples itself and leaves batched ones
alone, and it splits global batches over replicas evenly (see
``keras_compat.distribute_batches_evenly``); both need to know whether and
how a dataset is batched.
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


def static_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The batch size when every element has the same static leading size."""
    sizes = {
        spec.shape[0] if getattr(spec, "shape", None) is not None and spec.shape.rank else None
        for spec in tf.nest.flatten(dataset.element_spec)
    }
    return sizes.pop() if len(sizes) == 1 else None

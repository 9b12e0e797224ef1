"""What a tf.data pipeline is, read from its graph without reading any data.

hybridpar batches datasets of single examples itself and leaves batched ones
alone, splits global batches over replicas evenly, shards file-based input by
file, and refuses to send Python-backed datasets to parameter-server
workers; each needs to know something of the dataset's graph: whether and
how it is batched, how many files it reads, which Python ops it runs.
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


_READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
            "ArrayRecordDataset")
_PYTHON_OPS = ("PyFunc", "EagerPyFunc", "PyFuncStateless")


def dataset_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
    """The dataset's serialized graph (cheap; nothing is read)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())
    return graph


def _all_nodes(graph: tf.compat.v1.GraphDef) -> list[Any]:
    """The graph's nodes and those of the functions it calls (map, interleave, ...)."""
    return list(graph.node) + [n for f in graph.library.function for n in f.node_def]


def input_files(dataset: tf.data.Dataset) -> int | None:
    """How many files a dataset reads, or ``None`` when it reads none.

    Looks for file-reading datasets in the dataset's graph and counts the
    file names in the string constants that feed them.
    """
    nodes = _all_nodes(dataset_graph(dataset))
    if not any(node.op.startswith(_READERS) for node in nodes):
        return None
    counts = []
    for node in nodes:
        if node.op == "Const" and node.attr["dtype"].type == tf.string.as_datatype_enum:
            tensor = node.attr["value"].tensor
            dims = [d.size for d in tensor.tensor_shape.dim]
            if len(dims) == 1:
                counts.append(dims[0])
    return max(counts) if counts else 1


def python_ops(dataset: tf.data.Dataset) -> list[str]:
    """The Python-calling ops (``from_generator``, ``py_function``) a dataset runs."""
    return sorted({node.op for node in _all_nodes(dataset_graph(dataset))
                   if node.op in _PYTHON_OPS})


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

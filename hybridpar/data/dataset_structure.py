"""The structure of a tf.data pipeline, read from TensorFlow's own objects.

This is the one module that reads tf.data's private Python API (TensorFlow
2.21's ``tensorflow/python/data/ops``); ``hybridpar.data.inspect`` answers its
questions from what this module returns. Nothing here serializes the dataset
(``_as_serialized_graph`` copies every in-memory constant into a protobuf and
fails beyond 2 GB), so the cost depends on the pipeline's length, never on
the data it holds. What it reads:

- an eagerly built dataset is a Python object: ``dataset._inputs()`` gives
  the datasets it reads, ``dataset._functions()`` the
  ``StructuredFunctionWrapper``s of its map/filter/interleave/... functions,
  and its class names the transformation (``_BatchDataset``,
  ``_ParallelMapDataset``, ...); tensors it holds (``_tensors`` of
  ``from_tensor_slices``) are only looked at for their shape;
- a traced function (``StructuredFunctionWrapper.function.graph``, a
  ``FuncGraph``) is walked op by op; captured eager tensors are placeholders
  there, not copies. Functions it calls (a nested interleave's function,
  ``from_generator``'s ``next_func``, a ``tf.function`` called in a map) are
  found by the function attributes of its ops in the graph's library;
- a dataset built in graph mode (inside a ``tf.function``) is walked through
  the ops that produce its variant tensor, like a traced function.

Legacy ``Defun`` functions have no graph and are not looked into.
``hybridpar.data.pipeline_digest`` hashes a pipeline from what ``arguments``,
``function_graph``, ``called_graph``, ``variant_op`` and ``ancestors`` give.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, structured_function


class Stage:
    """One transformation of a pipeline: a dataset object or a dataset op.

    ``kind`` names it without leading underscores: the Python class for an
    eager dataset (``BatchDataset``, ``TFRecordDatasetV2``), the op type in a
    graph (``BatchDatasetV2``, ``Identity``).
    """

    kind: str
    #: The transformation keeps its input's element structure (an eager
    #: ``UnaryUnchangedStructureDataset``: prefetch, cache, shuffle, take, ...).
    keeps_structure: bool = False

    def upstream(self) -> Stage | None:
        """The stage this one reads its elements from (its first input)."""
        raise NotImplementedError

    def returned(self) -> Stage | None:
        """For interleave/flat_map/group_by_window: what its function returns."""
        raise NotImplementedError


class _EagerStage(Stage):
    def __init__(self, dataset: tf.data.Dataset):
        self._dataset = dataset
        self.kind = type(dataset).__name__.lstrip("_")
        self.keeps_structure = isinstance(dataset, dataset_ops.UnaryUnchangedStructureDataset)

    def upstream(self) -> Stage | None:
        inputs = _inputs(self._dataset)
        return output_stage(inputs[0]) if inputs else None

    def returned(self) -> Stage | None:
        for wrapper in _wrappers(self._dataset):
            if isinstance(wrapper.output_structure, tf.data.DatasetSpec):
                graph = _graph_of(wrapper.function)
                return _returned_by(graph) if graph is not None else None
        return None


class _OpStage(Stage):
    def __init__(self, op: tf.Operation):
        self._op = op
        self.kind = op.type

    def upstream(self) -> Stage | None:
        inputs = list(self._op.inputs)
        if inputs and inputs[0].dtype == tf.variant:
            return _OpStage(inputs[0].op)
        return None

    def returned(self) -> Stage | None:
        for graph in _called_graphs(self._op):
            stage = _returned_by(graph)
            if stage is not None:
                return stage
        return None


def output_stage(dataset: tf.data.Dataset) -> Stage:
    """The last transformation of ``dataset`` (where its elements come from)."""
    variant = dataset._variant_tensor
    if tf.is_symbolic_tensor(variant):
        return _OpStage(variant.op)
    return _EagerStage(dataset)


def variant_op(dataset: tf.data.Dataset) -> tf.Operation | None:
    """The op making a dataset built in graph mode; ``None`` for an eager dataset."""
    variant = dataset._variant_tensor
    return variant.op if tf.is_symbolic_tensor(variant) else None


# What an eager dataset object holds for its own process rather than for its pipeline: its
# variant tensor (a handle), the graph it was made in and its options (threading, autotune).
_PROCESS_ATTRIBUTES = ("_variant_tensor_attr", "_graph_attr", "_options_attr")


def arguments(dataset: tf.data.Dataset) -> list[tuple[str, Any]]:
    """An eager dataset's arguments as it holds them, by attribute name, in the order it
    set them: the datasets it reads, its tensors (counts, sizes, seeds, data), flags, its
    functions (``StructuredFunctionWrapper``s) and element structure."""
    return [(name, value) for name, value in vars(dataset).items()
            if name not in _PROCESS_ATTRIBUTES]


def function_graph(value: Any) -> Any:
    """The traced graph of a dataset's function (a map's, a filter's, ...), or ``None`` when
    ``value`` is no dataset function or a legacy ``Defun``."""
    if not isinstance(value, structured_function.StructuredFunctionWrapper):
        return None
    return _graph_of(value.function)


def underlying_dataset(value: Any) -> tf.data.Dataset | None:
    """``value`` itself if a dataset; a ``tf.distribute`` distributed dataset's
    (first) dataset; else None.

    ``DistributedDataset`` keeps the dataset it distributes as
    ``_original_dataset`` (or only its per-worker clones as
    ``_cloned_datasets``); ``DistributedDatasetsFromFunction`` keeps the
    datasets its function built as ``_datasets``.
    """
    if isinstance(value, tf.data.Dataset):
        return value
    original = getattr(value, "_original_dataset", None)
    if isinstance(original, tf.data.Dataset):
        return original
    for name in ("_cloned_datasets", "_datasets"):
        datasets = getattr(value, name, None)
        if datasets and isinstance(datasets[0], tf.data.Dataset):
            return datasets[0]
    return None


@dataclass(frozen=True)
class Contents:
    """Everything a pipeline contains, its functions' graphs included.

    Attributes:
        kinds: the stage kinds of its datasets and the op types of every graph
            it runs (dataset ops, ``PyFunc``, ``Const``, ...).
        string_vectors: the lengths of the string vectors it holds (tensors of
            its datasets, constants and captured tensors of its graphs).
    """

    kinds: frozenset[str]
    string_vectors: tuple[int, ...]


def contents(dataset: tf.data.Dataset) -> Contents:
    """What ``dataset`` and all the datasets and functions it reads contain."""
    kinds: set[str] = set()
    strings: list[int] = []
    graphs: list[Any] = []
    variant = dataset._variant_tensor
    if tf.is_symbolic_tensor(variant):
        graphs.extend(_add_ops(ancestors(variant.op), kinds, strings))
    else:
        for node in _eager_datasets(dataset):
            kinds.add(type(node).__name__.lstrip("_"))
            held = _attributes(node)
            strings.extend(_string_lengths(v for v in held if isinstance(v, tf.Tensor)))
            graphs.extend(_graph_of(wrapper.function) for wrapper in _wrappers(node))
    seen: set[int] = set()
    while graphs:
        graph = graphs.pop()
        if graph is not None and id(graph) not in seen:
            seen.add(id(graph))
            graphs.extend(_add_ops(graph.get_operations(), kinds, strings))
    return Contents(frozenset(kinds), tuple(strings))


def _add_ops(ops: Iterable[tf.Operation], kinds: set[str], strings: list[int]) -> list[Any]:
    """Adds the ops' types and string constants; returns the graphs they call."""
    called = []
    for op in ops:
        kinds.add(op.type)
        if op.type in ("Const", "Placeholder"):
            strings.extend(_string_lengths(op.outputs))
        called.extend(_called_graphs(op))
    return called


def _inputs(dataset: tf.data.Dataset) -> list[tf.data.Dataset]:
    try:
        return list(dataset._inputs())
    except NotImplementedError:
        return []


def _wrappers(dataset: tf.data.Dataset) -> list[Any]:
    """The dataset's ``StructuredFunctionWrapper``s (map, filter, interleave, ...)."""
    try:
        return list(dataset._functions())
    except NotImplementedError:
        return []


def _eager_datasets(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """``dataset`` and every dataset it reads or holds, each once.

    Held datasets are those among its attributes that ``_inputs()`` leaves
    out: a file reader's ``_filenames`` and ``_impl`` (the interleave that
    reads them), ``ragged_batch``'s ``_mapped_dataset``.
    """
    stack, seen = [dataset], set()
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            stack.extend(_inputs(node))
            stack.extend(v for v in _attributes(node) if isinstance(v, tf.data.Dataset))


def _attributes(dataset: tf.data.Dataset) -> list[Any]:
    """A dataset's attribute values, lists, tuples and dicts flattened."""
    return _flattened(list(vars(dataset).values()))


def _flattened(value: Any) -> list[Any]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flattened(item)]
    return [value]


def _string_lengths(tensors: Any) -> list[int]:
    return [t.shape[0] for t in tensors
            if t.dtype == tf.string and t.shape.rank == 1 and t.shape[0] is not None]


def _graph_of(function: Any) -> Any:
    """A traced function's ``FuncGraph`` (None for a legacy ``Defun``)."""
    return getattr(function, "graph", None)


def _returned_by(graph: Any) -> Stage | None:
    """The stage making the dataset a traced function returns, if it returns one."""
    outputs = list(getattr(graph, "outputs", ()))
    if outputs and outputs[0].dtype == tf.variant:
        return _OpStage(outputs[0].op)
    return None


def _called_graphs(op: tf.Operation) -> list[Any]:
    """The graphs of the functions an op calls."""
    graphs = [called_graph(op, name) for name in _called_names(op)]
    return [graph for graph in graphs if graph is not None]


def called_graph(op: tf.Operation, name: str) -> Any:
    """The graph of function ``name`` as ``op`` calls it, looked up in its graph's library
    (or an outer graph's, for a function graph); ``None`` if no such function has one."""
    graph = op.graph
    while graph is not None and not graph._is_function(name):
        graph = getattr(graph, "outer_graph", None)
    return _graph_of(graph._get_function(name)) if graph is not None else None


def _called_names(op: tf.Operation) -> list[str]:
    """The op's type (a function may be called by name) and its ``func`` attributes.

    Attribute names come from the op's registered ``OpDef`` and values from
    ``get_attr``: ``op.node_def`` would copy a constant's whole value.
    """
    names = [op.type]
    try:
        attrs = op.graph.op_def_for_type(op.type).attr
    except (RuntimeError, tf.errors.OpError):
        return names
    for attr in attrs:
        try:
            if attr.type == "func":
                names.append(op.get_attr(attr.name).name)
            elif attr.type == "list(func)":
                names.extend(f.name for f in op.get_attr(attr.name))
        except ValueError:  # an optional attribute the op does not set
            pass
    return names


def ancestors(op: tf.Operation) -> Iterator[tf.Operation]:
    """``op`` and every op it depends on in its graph, each once."""
    stack, seen = [op], set()
    while stack:
        node = stack.pop()
        if node.name not in seen:
            seen.add(node.name)
            yield node
            stack.extend(t.op for t in node.inputs)
            stack.extend(node.control_inputs)

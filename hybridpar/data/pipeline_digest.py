"""A structural digest of a tf.data pipeline: which pipeline a saved input position is for.

A checkpoint saves the state of ``fit``'s input iterator
(``hybridpar.checkpoint.input_state``); restored into another pipeline (the
data's ``take(70)`` where it read all of it, other files, another ``map`` or
batch size) that state would put the iterator at a meaningless place, at
worst past its end. ``digest`` names the pipeline so a resume can tell.

It hashes what ``hybridpar.data.dataset_structure`` reads of the pipeline's
Python objects and traced graphs, never a serialization of the dataset
(TensorFlow's ``DatasetFingerprint`` op took 12.6 s and 11 GB for 2.2 GB of
in-memory data), so its cost grows with the pipeline's length, not its data:

- every dataset: its class, element spec and arguments (the datasets it
  reads, counts, sizes, seeds, flags, functions), in the order it holds them;
- tensors up to ``SMALL_BYTES`` (file names, a take count) by value; larger
  ones (in-memory data) by dtype, shape and ``BLOCKS`` blocks of
  ``BLOCK_BYTES`` spread over them, sliced out by TensorFlow, so only those
  blocks are read;
- every function it runs (map, filter, interleave, what they call) op by op:
  type, inputs by position, outputs, attributes, constants and captured
  tensors (by the rule above), a called function by its own digest, never by
  its name, which carries a counter of the process (``__inference_f_123``).

Not covered: the contents of files, a large tensor's values between its
blocks, a large constant inside a function (its dtype and shape only), the
values of variables and tables a function reads, the dataset's options.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import tensorflow as tf

from hybridpar.data import dataset_structure

SMALL_BYTES = 1 << 20  # read whole up to this size
SMALL_STRINGS = 1 << 14  # string tensors: elements read whole up to this count
BLOCKS = 8  # blocks read of a larger tensor
BLOCK_BYTES = 4096

# Attributes that describe the process rather than the function: the session config a call
# runs under (its device counts), and names TensorFlow numbers per process.
_PROCESS_ATTRS = frozenset({"config", "config_proto", "executor_type"})
_NUMBERED_ATTRS = frozenset({"token", "shared_name", "container"})
_NUMBER_SUFFIX = re.compile(r"(_\d+)+$")


def digest(dataset: tf.data.Dataset) -> str:
    """The pipeline's structural digest (hex SHA-256), the same in every process that
    builds the same pipeline (module doc for what it covers)."""
    walk = _Walk({}, {})
    walk.add("element_spec", repr(dataset.element_spec))
    walk.value(dataset)
    return walk.hexdigest()


def stable_name(name: str) -> str:
    """A function (or numbered resource) name without the counter suffix TensorFlow gives it."""
    return _NUMBER_SUFFIX.sub("", name)


def block_starts(elements: int, block: int, blocks: int = BLOCKS) -> list[int]:
    """Where the sampled blocks of ``block`` elements begin in a flat tensor of ``elements``:
    ``blocks`` of them, evenly spread, the first at 0 and the last at the end."""
    last = max(elements - block, 0)
    if blocks == 1 or last == 0:
        return [0]
    return sorted({round(i * last / (blocks - 1)) for i in range(blocks)})


def _item_bytes(dtype: tf.DType) -> int:
    return 1 if dtype == tf.string else dtype.size


def _is_small(dtype: tf.DType, elements: int) -> bool:
    if dtype == tf.string:
        return elements <= SMALL_STRINGS
    return elements * dtype.size <= SMALL_BYTES


def _small_output(op: tf.Operation) -> bool:
    """Whether the op's (a constant's) value is small enough to read whole."""
    shape = op.outputs[0].shape if op.outputs else tf.TensorShape(None)
    return shape.is_fully_defined() and _is_small(op.outputs[0].dtype, shape.num_elements())


def _bytes_of(array: Any) -> bytes:
    """The bytes of a small numpy array (strings: each one length-prefixed)."""
    array = np.asarray(array)
    if array.dtype == object:
        return b"".join(len(item).to_bytes(8, "little") + item for item in array.reshape(-1))
    return np.ascontiguousarray(array).tobytes()


class _Walk:
    """One running SHA-256 over a pipeline; the memo of datasets and graphs is shared with
    the walks of the graphs it meets."""

    def __init__(self, datasets: dict[int, Any], graphs: dict[int, str]) -> None:
        self._sha = hashlib.sha256()
        self._datasets = datasets  # id -> (index, dataset): kept alive, so ids stay unique
        self._graphs = graphs  # id -> digest

    def add(self, *parts: Any) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode()
            self._sha.update(len(data).to_bytes(8, "little") + data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def value(self, value: Any) -> None:
        """Adds one argument of a dataset (or an element of one), by its kind."""
        graph = dataset_structure.function_graph(value)
        if isinstance(value, tf.data.Dataset):
            self._dataset(value)
        elif graph is not None:
            self.add("function", self.graph(graph))
        elif isinstance(value, (tf.Tensor, tf.Variable)):
            self._tensor(value)
        elif isinstance(value, np.ndarray):
            self._array(value)
        elif isinstance(value, (list, tuple)):
            self.add(type(value).__name__, len(value))
            for item in value:
                self.value(item)
        elif isinstance(value, dict):
            self.add("dict", len(value))
            for key in sorted(value, key=str):
                self.add(key)
                self.value(value[key])
        elif value is None or isinstance(value, (bool, int, float, str, bytes, tf.TypeSpec,
                                                 tf.DType, tf.TensorShape)):
            self.add(type(value).__name__, repr(value))
        else:  # an object of its own: its repr may name its address
            self.add("object", type(value).__qualname__)

    def _dataset(self, dataset: tf.data.Dataset) -> None:
        seen = self._datasets.get(id(dataset))
        if seen is not None:
            self.add("dataset seen", seen[0])
            return
        self._datasets[id(dataset)] = (len(self._datasets), dataset)
        self.add("dataset", type(dataset).__qualname__, repr(dataset.element_spec))
        op = dataset_structure.variant_op(dataset)
        if op is not None:  # built in graph mode: the ops that make its variant
            ops = list(dataset_structure.ancestors(op))[::-1]
            self.add("ops", self._ops_digest(ops, _captured(op.graph), op.outputs[:1]))
            return
        for name, value in dataset_structure.arguments(dataset):
            self.add(name)
            self.value(value)

    def graph(self, graph: Any) -> str:
        """A traced function's digest (memoized: a function called twice is walked once)."""
        known = self._graphs.get(id(graph))
        if known is None:
            self._graphs[id(graph)] = "recursive"
            known = self._ops_digest(graph.get_operations(), _captured(graph), graph.outputs)
            self._graphs[id(graph)] = known
        return known

    def _ops_digest(self, ops: list[tf.Operation], captured: dict[str, Any],
                    outputs: list[tf.Tensor]) -> str:
        walk = _Walk(self._datasets, self._graphs)
        index = {op.name: i for i, op in enumerate(ops)}
        for op in ops:
            walk.add("op", walk._kind(op), len(op.inputs))
            for tensor in op.inputs:
                walk.add(index.get(tensor.op.name, -1), tensor.value_index)
            walk.add("control", *sorted(index.get(c.name, -1) for c in op.control_inputs))
            for tensor in op.outputs:
                walk.add(tensor.dtype.name, tensor.shape)
            walk._attrs(op)
            if op.name in captured:
                walk.add("captured")
                walk.value(captured[op.name])
        for tensor in outputs:
            walk.add("output", index.get(tensor.op.name, -1), tensor.value_index)
        return walk.hexdigest()

    def _kind(self, op: tf.Operation) -> str:
        """The op's type; for a function called by name, that function's digest."""
        called = dataset_structure.called_graph(op, op.type)
        if called is not None:
            return "call " + self.graph(called)
        return op.type

    def _attrs(self, op: tf.Operation) -> None:
        """Adds the attributes of the op's registered ``OpDef`` (``op.node_def`` would copy a
        constant's whole value)."""
        try:
            attrs = op.graph.op_def_for_type(op.type).attr
        except (KeyError, RuntimeError, ValueError, tf.errors.OpError):
            self.add("no op def", stable_name(op.type))
            return
        for attr in attrs:
            if attr.name in _PROCESS_ATTRS:
                continue
            if attr.type == "tensor" and not _small_output(op):
                self.add(attr.name, "large")  # its dtype and shape came with the outputs
                continue
            try:
                value = op.get_attr(attr.name)
            except ValueError:  # an optional attribute the op does not set
                continue
            self.add(attr.name)
            self._attr(op, attr.name, attr.type, value)

    def _attr(self, op: tf.Operation, name: str, kind: str, value: Any) -> None:
        if kind == "func":
            self.add(self._function(op, value.name))
        elif kind == "list(func)":
            self.add(*(self._function(op, f.name) for f in value))
        elif kind == "tensor":
            self.add(value.SerializeToString(deterministic=True))
        elif name in _NUMBERED_ATTRS:
            self.add(stable_name(value.decode() if isinstance(value, bytes) else str(value)))
        else:
            self.add(repr(value))

    def _function(self, op: tf.Operation, name: str) -> str:
        called = dataset_structure.called_graph(op, name)
        return self.graph(called) if called is not None else stable_name(name)

    def _tensor(self, tensor: Any) -> None:
        """By value when small, else by dtype, shape and sampled blocks; a symbolic tensor or
        a handle (resource, variant) by dtype and shape only."""
        dtype, shape = tensor.dtype, tensor.shape
        self.add("tensor", dtype.name, shape)
        if (isinstance(tensor, tf.Variable) or tf.is_symbolic_tensor(tensor)
                or dtype in (tf.resource, tf.variant) or not shape.is_fully_defined()):
            return
        elements = shape.num_elements()
        if _is_small(dtype, elements):
            self.add(_bytes_of(tensor.numpy()))
            return
        block = max(BLOCK_BYTES // _item_bytes(dtype), 1)
        flat = tf.reshape(tensor, [-1])
        for start in block_starts(elements, block):
            self.add(start, _bytes_of(flat[start:start + block].numpy()))

    def _array(self, array: np.ndarray) -> None:
        self.add("array", array.dtype.str, array.shape)
        if array.dtype == object:  # Python objects: their reprs may name addresses
            return
        if array.nbytes <= SMALL_BYTES:
            self.add(_bytes_of(array))
            return
        block = max(BLOCK_BYTES // max(array.itemsize, 1), 1)
        for start in block_starts(array.size, block):
            self.add(start, _bytes_of(array.flat[start:start + block]))


def _captured(graph: Any) -> dict[str, Any]:
    """The tensors a function graph captures from outside, by the name of the op standing
    for each inside (a placeholder, or a constant TensorFlow copied in)."""
    return {internal.op.name: external
            for external, internal in getattr(graph, "captures", ())}

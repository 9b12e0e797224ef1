"""Megatron's split compute for the layers whose weights a tensor plan splits.

A layer whose weight is stored split (``split_variable``) but runs its own
``call`` reads the weight whole, a gather of the shards every step. For the
layers the automatic layout splits, hybridpar replaces the instance's
``call`` (the class is untouched) by the split compute of Megatron-LM
(Shoeybi et al., 2019), each shard's ops under ``tf.device`` of its device
in the running replica:

- a *column* ``Dense``/``EinsumDense`` (output features or heads split)
  computes each shard's slice of the output on its device from the whole
  input; the slices are recorded, keyed by their joined tensor, so the next
  split call reads them without joining;
- an attention layer's ``_compute_attention`` runs once per shard of heads
  when its query, key and value come split (keras ``MultiHeadAttention`` and
  keras_hub's ``CachedMultiHeadAttention``; a key or value repeated for
  grouped heads is repeated per shard, ``slice_replay.repeated``), and its
  rotary embedding layer, which treats each head alike, once per shard;
- a *row* layer (input features or heads split) multiplies each input slice
  by its shard on that device and sums the partial outputs: Megatron's
  all-reduce, on the group's first device. An input made from recorded slices
  by elementwise ops (Llama's gated MLP) has those ops replayed per shard
  (``slice_replay``).

Each shard's ops open a ``hybridpar_stage<k>_shard<t>`` name scope, by which
``compat.stage_gradients`` builds their gradients on the same device. An
input that does not come as recorded slices (an elementwise op between the
pair, such as Llama's gated MLP) is split where it is, which is correct and
moves the whole activation. Outside a hybridpar strategy the original call
runs (reading the weights whole).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import keras
import tensorflow as tf

from hybridpar.parallel import slice_replay
from hybridpar.parallel.split_variable import SplitVariable
from hybridpar.parallel.staging import shard_scope_name
from hybridpar.state import state_of

_EQUATION = re.compile(r"^([a-z.]+),([a-z]+)->([a-z.]+)$")


@dataclasses.dataclass(frozen=True)
class Slices:
    """A tensor recorded as ``parts`` along ``axis`` (non-negative)."""

    axis: int
    parts: tuple[tf.Tensor, ...]


def _recorded() -> dict[Any, Slices] | None:
    """The slices recorded in the graph being traced (``None`` when eager)."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    table = getattr(graph, "_hybridpar_slices", None)
    if table is None:
        table = {}
        graph._hybridpar_slices = table
    return table


def joined(parts: list[tf.Tensor], axis: int) -> tf.Tensor:
    """The parts joined along ``axis``, recorded so a split call can take them back."""
    axis = axis % parts[0].shape.rank
    whole = tf.concat(parts, axis)
    table = _recorded()
    if table is not None:
        table[whole.ref()] = Slices(axis, tuple(parts))
    return whole


def slices_of(tensor: Any, axis: int, size: int,
              place: Callable[[int], AbstractContextManager[Any]] | None = None
              ) -> list[tf.Tensor]:
    """``tensor`` in ``size`` slices along ``axis``: the recorded ones, those replayed from
    recorded ones through elementwise ops (``slice_replay``, each shard's under
    ``place(shard)``), or a split."""
    tensor = tf.convert_to_tensor(tensor)
    axis = axis % tensor.shape.rank
    table = _recorded()

    def recorded(value: tf.Tensor) -> list[tf.Tensor] | None:
        found = table.get(value.ref()) if table is not None else None
        if found is not None and found.axis == axis and len(found.parts) == size:
            return list(found.parts)
        return None

    found = recorded(tensor)
    if found is None and place is not None and table is not None:
        found = slice_replay.replayed(tensor, axis, size, recorded, place)
    return found if found is not None else tf.split(tensor, size, axis)


@contextlib.contextmanager
def on_shard(state: Any, stage: int, shard: int) -> Iterator[None]:
    """Ops of ``shard`` of ``stage`` in the running replica, marked for their gradients."""
    with (tf.device(state.placer.device_for(stage, shard)),
          tf.name_scope(shard_scope_name(stage, shard))):
        yield


def running_state(stage: int) -> Any:
    """The hybridpar state when a replica of its strategy runs ``stage`` now, else ``None``."""
    state = state_of(tf.distribute.get_strategy())
    return None if state is None or state.placer.device_for(stage) is None else state


def shard_reads(variable: Any, dtype: Any) -> list[tf.Tensor] | None:
    """The shards of a split Keras variable read in ``dtype`` (``None`` if it is whole)."""
    value = getattr(variable, "_value", None)
    if not isinstance(value, SplitVariable):
        return None
    reads = [tf.convert_to_tensor(shard) for shard in value.variables]
    return [tf.cast(read, dtype) if read.dtype != dtype else read for read in reads]


def _whole(variable: Any, dtype: Any) -> tf.Tensor:
    value = tf.convert_to_tensor(variable)
    return tf.cast(value, dtype) if value.dtype != dtype else value


@dataclasses.dataclass(frozen=True)
class Kernel:
    """How a layer's kernel is split: ``column`` (an output axis) or ``row`` (an input axis).

    Attributes:
        kind: ``"column"`` or ``"row"``.
        axis: the axis of the output (column) or input (row) that is split,
            counted from the end when negative.
    """

    kind: str
    axis: int


def _spec_axis(spec: str, letter: str) -> int:
    """The axis of ``letter`` in an einsum operand ``spec`` (negative after an ellipsis)."""
    if spec.startswith("..."):
        letters = spec[3:]
        return letters.index(letter) - len(letters)
    return spec.index(letter)


def kernel_split(layer: Any) -> Kernel | None:
    """The split of ``layer``'s kernel, or ``None`` when its call is not split."""
    kernel = getattr(getattr(layer, "_kernel", None), "_value", None)
    if not isinstance(kernel, SplitVariable) or getattr(layer, "lora_enabled", False):
        return None
    if getattr(layer, "quantization_mode", None) is not None:
        return None
    bias = getattr(layer, "bias", None)
    bias_split = bias is not None and isinstance(bias._value, SplitVariable)
    if isinstance(layer, keras.layers.Dense):
        kind = "column" if kernel.axis == 1 else "row"
        axis = -1
    elif isinstance(layer, keras.layers.EinsumDense):
        match = _EQUATION.match(layer.equation.replace(" ", ""))
        if match is None or "." in match[2]:
            return None
        source, weights, target = match.groups()
        letter = weights[kernel.axis]
        kind = "column" if letter in target else "row"
        spec = target if kind == "column" else source
        if letter not in spec or ("." in spec and not spec.startswith("...")):
            return None
        axis = _spec_axis(spec, letter)
    else:
        return None
    if bias is not None and bias_split != (kind == "column"):
        return None  # a column's bias is split with its outputs, a row's is added once
    return Kernel(kind, axis)


def _product(layer: Any, inputs: Any, kernel: tf.Tensor) -> tf.Tensor:
    if isinstance(layer, keras.layers.EinsumDense):
        return keras.ops.einsum(layer.equation, inputs, kernel)
    return keras.ops.matmul(inputs, kernel)


def _activated(layer: Any, value: tf.Tensor) -> tf.Tensor:
    return layer.activation(value) if layer.activation is not None else value


def _column_call(layer: Any, split: Kernel, stage: int, original: Any) -> Any:
    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        state = running_state(stage)
        if state is None:
            return original(inputs, *args, **kwargs)
        kernels = shard_reads(layer._kernel, layer.compute_dtype)
        biases = (shard_reads(layer.bias, layer.compute_dtype) if layer.bias is not None
                  else [None] * len(kernels))
        parts = []
        for shard, (kernel, bias) in enumerate(zip(kernels, biases, strict=True)):
            with on_shard(state, stage, shard):
                value = _product(layer, inputs, kernel)
                parts.append(_activated(layer, value if bias is None else value + bias))
        return joined(parts, split.axis)

    return call


def _row_call(layer: Any, split: Kernel, stage: int, original: Any) -> Any:
    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        state = running_state(stage)
        if state is None:
            return original(inputs, *args, **kwargs)
        kernels = shard_reads(layer._kernel, layer.compute_dtype)
        pieces = slices_of(inputs, split.axis, len(kernels),
                           lambda shard: on_shard(state, stage, shard))
        partial = []
        for shard, (piece, kernel) in enumerate(zip(pieces, kernels, strict=True)):
            with on_shard(state, stage, shard):
                partial.append(_product(layer, piece, kernel))
        value = tf.add_n(partial)
        if layer.bias is not None:
            value = value + _whole(layer.bias, layer.compute_dtype)
        return _activated(layer, value)

    return call


def _attention_inputs(tensors: list[Any], size: int, place: Any) -> list[Slices] | None:
    """The recorded slices of an attention call's query, key and value (a key or value
    may be a ``tf.repeat`` of recorded slices: grouped key/value heads), or ``None``."""
    table = _recorded()
    if table is None or any(t is None for t in tensors):
        return None
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    query = table.get(tensors[0].ref())
    if query is None or len(query.parts) != size or query.parts[0].shape.rank != 4:
        return None

    def recorded(value: tf.Tensor) -> list[tf.Tensor] | None:
        found = table.get(value.ref())
        return list(found.parts) if found is not None and found.axis == query.axis and len(
            found.parts) == size else None

    result = [query]
    for tensor in tensors[1:]:
        parts = recorded(tensor) or slice_replay.repeated(tensor, query.axis, recorded, place)
        if parts is None:
            return None
        result.append(Slices(query.axis, tuple(parts)))
    return result


def _attention_call(stage: int, size: int, original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compute_attention(*args, **kwargs):
        state = running_state(stage)
        bound = signature.bind(*args, **kwargs)
        found = None if state is None else _attention_inputs(
            [bound.arguments.get(name) for name in ("query", "key", "value")], size,
            lambda shard: on_shard(state, stage, shard))
        if found is None:
            return original(*args, **kwargs)
        results = []
        for shard in range(size):
            arguments = dict(bound.arguments)
            arguments.update(query=found[0].parts[shard], key=found[1].parts[shard],
                             value=found[2].parts[shard])
            with on_shard(state, stage, shard):
                results.append(original(**arguments))
        if not isinstance(results[0], tuple):
            return joined(results, found[0].axis)
        outputs, scores = zip(*results, strict=True)
        score = None if scores[0] is None else tf.concat(scores, 1)  # (B, heads, T, S)
        return joined(list(outputs), found[0].axis), score

    return compute_attention


def _headwise_call(layer: Any, stage: int, original: Any) -> Any:
    """A rotary embedding's call, run per shard on inputs recorded as slices of heads
    (any axis but its sequence and feature axes: it treats each head alike)."""
    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        state = running_state(stage)
        table = _recorded()
        found = table.get(tf.convert_to_tensor(inputs).ref()) if table is not None else None
        if state is None or found is None or found.axis in layer._normalize_axes(
                inputs.shape):
            return original(inputs, *args, **kwargs)
        parts = []
        for shard, part in enumerate(found.parts):
            with on_shard(state, stage, shard):
                parts.append(original(part, *args, **kwargs))
        return joined(parts, found.axis)

    return call


def _attention_layers(model: Any) -> Iterator[Any]:
    """The layers whose query, key and value projections are column-split."""
    for layer in model._flatten_layers():
        projections = [getattr(layer, f"_{name}_dense", None) for name in ("query", "key", "value")]
        if hasattr(layer, "_compute_attention") and all(
                p is not None and getattr(kernel_split(p), "kind", None) == "column"
                for p in projections):
            yield layer


def install(model: Any, stage_of: Any, size: int) -> int:
    """Replaces the calls of ``model``'s split layers by their split compute.

    Args:
        model: a model whose weights are split.
        stage_of: the stage of a split layer (called with the layer).
        size: devices per tensor-parallel group.

    Returns:
        How many calls were replaced.
    """
    replaced = 0
    for layer in model._flatten_layers():
        split = kernel_split(layer)
        if split is None or "call" in vars(layer):
            continue
        wrap = _column_call if split.kind == "column" else _row_call
        object.__setattr__(layer, "call", wrap(layer, split, stage_of(layer), layer.call))
        replaced += 1
    for layer in _attention_layers(model):
        stage = stage_of(layer._query_dense)
        if "_compute_attention" not in vars(layer):
            object.__setattr__(layer, "_compute_attention", _attention_call(
                stage, size, layer._compute_attention))
            replaced += 1
        rotary = getattr(layer, "rotary_embedding_layer", None)
        if hasattr(rotary, "_normalize_axes") and "call" not in vars(rotary):
            object.__setattr__(rotary, "call", _headwise_call(rotary, stage, rotary.call))
            replaced += 1
    return replaced


def uninstall(model: Any) -> None:
    """Gives every layer of ``model`` its class's calls back."""
    for layer in model._flatten_layers():
        for name in ("call", "_compute_attention"):
            if name in vars(layer):
                object.__delattr__(layer, name)

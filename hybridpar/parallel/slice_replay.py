"""Elementwise ops between split layers, replayed on each shard's slice.

A row layer's input that was not recorded as slices (``tensor_calls.joined``)
may still be made from recorded slices by elementwise ops only: Llama's gated
MLP feeds ``silu(gate) * up`` of two column layers to its row layer, and
``silu`` is a ``tf.custom_gradient`` (``x * sigmoid(beta * x)`` under an
``IdentityN`` that carries the custom gradient). ``replayed`` walks such a
tensor's ops back to the recorded slices and creates each op again per
shard, same type and attributes, through ``tf.raw_ops`` (so the tape records
it) under the shard's device scope; the whole ops are then read by nothing
and pruned from the step. ``IdentityN`` passes its input through, so the
replayed ops are differentiated as written (for ``silu``, the same function
as its custom gradient). Operands that do not span the split axis (scalars,
size-1 axes) are used whole by every shard.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import tensorflow as tf

ELEMENTWISE = frozenset({
    "Abs", "Add", "AddV2", "Cast", "Cos", "Elu", "Erf", "Exp", "Gelu", "Identity", "LeakyRelu",
    "Log", "Log1p", "Maximum", "Minimum", "Mul", "Neg", "Pow", "RealDiv", "Reciprocal", "Relu",
    "Relu6", "Rsqrt", "Selu", "Sigmoid", "Sin", "Softplus", "Softsign", "Sqrt", "Square",
    "SquaredDifference", "Sub", "Tanh",
})
PASS_THROUGH = frozenset({"IdentityN"})  # output i is input i (tf.custom_gradient's wrapper)
MAX_OPS = 32  # ops looked at: 4x this many

Slices = Callable[[tf.Tensor], "list[tf.Tensor] | None"]


def _spans(tensor: tf.Tensor, axis_from_end: int) -> bool:
    """Whether ``tensor``, broadcast against the full shape, varies along the split axis."""
    shape = tensor.shape
    if shape.rank is None:
        return True
    if shape.rank < -axis_from_end:
        return False
    return shape[axis_from_end] != 1


def _inferred_attrs(op_def: Any) -> set[str]:
    names = set()
    for arg in op_def.input_arg:
        names.update(name for name in (arg.type_attr, arg.number_attr, arg.type_list_attr)
                     if name)
    return names


def _replay(op: tf.Operation, inputs: list[tf.Tensor]) -> tf.Tensor:
    """``op`` created again on ``inputs`` (its single output)."""
    op_def = op.op_def
    inferred = _inferred_attrs(op_def)
    attrs = {attr.name: op.get_attr(attr.name) for attr in op_def.attr
             if attr.name not in inferred}
    arguments = {arg.name: value for arg, value in zip(op_def.input_arg, inputs, strict=True)}
    return getattr(tf.raw_ops, op.type)(**arguments, **attrs)


def _walk(tensor: tf.Tensor, axis_from_end: int, recorded: Slices
          ) -> tuple[dict[Any, Any], list[tf.Tensor]] | None:
    """The ops to replay for ``tensor``, inputs first, and what each tensor is per shard
    (recorded slices, or ``None`` for an operand every shard uses whole)."""
    full = tensor.shape
    plan: dict[Any, Any] = {}
    order: list[tf.Tensor] = []
    visits = [0]

    def visit(value: tf.Tensor) -> bool:
        key = value.ref()
        if key in plan:
            return True
        visits[0] += 1
        if visits[0] > 4 * MAX_OPS:
            return False
        found = recorded(value)
        if found is not None or not _spans(value, axis_from_end):
            plan[key] = found  # None: used whole by every shard
            return True
        op = value.op
        if value.shape != full:
            return False
        if op.type in PASS_THROUGH:
            sources = [op.inputs[value.value_index]]
        elif op.type in ELEMENTWISE and len(op.outputs) == 1:
            sources = list(op.inputs)
        else:
            return False
        if not all(visit(source) for source in sources):
            return False
        order.append(value)
        plan[key] = []
        return True

    return (plan, order) if visit(tensor) and order else None


def replayed(tensor: tf.Tensor, axis: int, size: int, recorded: Slices,
             on_shard: Callable[[int], AbstractContextManager[Any]]) -> list[tf.Tensor] | None:
    """``tensor`` as ``size`` slices along ``axis``, replayed from recorded slices.

    Args:
        tensor: a tensor of the graph being traced.
        axis: the split axis (non-negative).
        size: the number of shards.
        recorded: the recorded slices of a tensor along ``axis`` in ``size``
            parts, or ``None``.
        on_shard: the device (and name) scope of a shard's ops.

    Returns:
        The slices, or ``None`` when an op on the way is not elementwise, an
        operand spanning the split axis comes from no recorded slices, or more
        than ``4 * MAX_OPS`` tensors would have to be looked at.
    """
    if tensor.shape.rank is None or not tensor.shape.is_fully_defined():
        return None
    walked = _walk(tensor, axis - tensor.shape.rank, recorded)
    if walked is None:
        return None
    plan, order = walked
    for value in order:
        if value.op.type in PASS_THROUGH:
            plan[value.ref()] = plan[value.op.inputs[value.value_index].ref()]
            continue
        operands = [plan[source.ref()] for source in value.op.inputs]
        parts = []
        for shard in range(size):
            with on_shard(shard):
                parts.append(_replay(value.op, [source if part is None else part[shard]
                                                for source, part in zip(value.op.inputs,
                                                                        operands, strict=True)]))
        plan[value.ref()] = parts
    return plan[tensor.ref()]


def _constant(tensor: tf.Tensor) -> Any:
    value = tf.get_static_value(tensor)
    return None if value is None else value.tolist()


def repeated(tensor: tf.Tensor, axis: int, recorded: Slices,
             on_shard: Callable[[int], AbstractContextManager[Any]]) -> list[tf.Tensor] | None:
    """``tensor`` as slices along ``axis`` when it is ``tf.repeat`` of recorded slices.

    ``tf.repeat(x, r, axis=a)`` (``keras.ops.repeat``; grouped-query attention
    repeats its key and value heads) is ``Reshape(Tile(ExpandDims(x, a + 1)))``.
    Repeating each of ``x``'s contiguous slices along ``a`` gives the
    contiguous slices of the repeated tensor, so each shard repeats its own.

    Returns:
        The slices, or ``None`` when ``tensor`` is not such a repeat along ``axis``.
    """
    if tensor.op.type != "Reshape" or tensor.op.inputs[0].op.type != "Tile":
        return None
    tile = tensor.op.inputs[0].op
    if tile.inputs[0].op.type != "ExpandDims":
        return None
    source = tile.inputs[0].op.inputs[0]
    parts = recorded(source)
    if parts is None or _constant(tile.inputs[0].op.inputs[1]) != axis + 1:
        return None
    shape = source.shape.as_list()
    times = (tensor.shape[axis] or 0) // (shape[axis] or 1)
    if (times < 1 or tile.outputs[0].shape.as_list() != [*shape[:axis + 1], times,
                                                         *shape[axis + 1:]]
            or tensor.shape.as_list() != [*shape[:axis], shape[axis] * times, *shape[axis + 1:]]):
        return None
    result = []
    for shard, part in enumerate(parts):
        with on_shard(shard):
            result.append(tf.repeat(part, times, axis=axis))
    return result

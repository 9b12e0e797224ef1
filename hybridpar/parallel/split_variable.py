"""A weight stored as the shards of a tensor-parallel group, seen whole by Keras.

A Keras variable whose weight a tensor-parallel layout splits holds a
``SplitVariable`` as its value: one variable per device of the group, each
the slice ``j`` of the logical tensor along ``axis`` (under a strategy, each
shard is mirrored over that device of every replica). The Keras variable
keeps its path and full shape, so ``model.weights``, ``get_weights``,
``set_weights`` and ``.weights.h5`` files see the weight as one device
would; a read joins the shards (``tf.concat`` of each shard's local value,
so a gradient taken against the shards flows through it), and an assign
splits the value. The optimizer and the tape work on the shards, one Keras
variable each (``ShardView`` in ``hybridpar.compat.shard_views``), so the
slots follow them onto their devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_conversion_registry


class SplitVariable:
    """One logical variable made of ``len(shards)`` slices along ``axis``.

    Args:
        shards: the shard variables, slice 0 first, equal in shape.
        axis: the axis the logical tensor is split on.
        name: the logical variable's name.
    """

    def __init__(self, shards: Sequence[Any], axis: int, name: str) -> None:
        self.variables = tuple(shards)
        self.axis = axis
        self.name = name
        self.dtype = self.variables[0].dtype
        self.trainable = self.variables[0].trainable
        shape = self.variables[0].shape.as_list()
        shape[axis] = sum(int(shard.shape[axis]) for shard in self.variables)
        self.shape = tf.TensorShape(shape)

    def read_value(self) -> tf.Tensor:
        """The logical tensor: the shards joined along ``axis``."""
        if tf.distribute.in_cross_replica_context():
            parts = [shard.read_value() for shard in self.variables]
        else:
            parts = [tf.convert_to_tensor(shard) for shard in self.variables]
        return tf.concat(parts, self.axis)

    def value(self) -> tf.Tensor:
        return self.read_value()

    def numpy(self) -> np.ndarray:
        return self.read_value().numpy()

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.numpy(), dtype=dtype)

    def assign(self, value: Any, use_locking: bool = False, name: str | None = None,
               read_value: bool = True) -> SplitVariable:
        """Assigns the logical ``value``: each shard gets its slice."""
        pieces = tf.split(tf.convert_to_tensor(value, self.dtype), len(self.variables), self.axis)
        for shard, piece in zip(self.variables, pieces, strict=True):
            shard.assign(piece)
        return self

    def __repr__(self) -> str:
        return (f"<SplitVariable {self.name} shape={self.shape.as_list()} axis={self.axis} "
                f"shards={len(self.variables)}>")


def _as_tensor(variable: SplitVariable, dtype: Any = None, name: str | None = None,
               as_ref: bool = False) -> tf.Tensor:
    value = variable.read_value()
    return value if dtype is None else tf.cast(value, dtype)


tensor_conversion_registry.register_tensor_conversion_function(SplitVariable, _as_tensor)


def create_split(next_creator: Callable[..., Any], kwargs: dict[str, Any], axis: int,
                 colocations: Sequence[Any]) -> SplitVariable:
    """Creates the shards of a variable the strategy was asked for, one per group device.

    The logical initial value is computed once, as on one device (the same
    initializer and seed give the same weights), and sliced.

    Args:
        next_creator: the strategy's variable creator.
        kwargs: the arguments of the variable being created.
        axis: the axis to split.
        colocations: per shard, the ``colocate_with`` target that puts it on
            its device of every replica.
    """
    initial = kwargs["initial_value"]
    with tf.init_scope():
        full = tf.convert_to_tensor(initial() if callable(initial) else initial)
    pieces = tf.split(full, len(colocations), axis)
    shards = [next_creator(**{**kwargs, "initial_value": piece,
                              "name": f"{kwargs.get('name') or 'Variable'}_shard{index}",
                              "colocate_with": colocation})
              for index, (piece, colocation) in enumerate(zip(pieces, colocations, strict=True))]
    return SplitVariable(shards, axis, kwargs.get("name") or "Variable")

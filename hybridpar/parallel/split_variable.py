"""A weight stored as the shards of a tensor-parallel group, seen whole by Keras.

A Keras variable whose weight a tensor-parallel layout splits holds a
``SplitVariable`` as its value (``split_in_place``, once the model is
built): one variable per device of the group, each the slice ``j`` of the
logical tensor along ``axis`` (under a strategy, each shard is mirrored over
that device of every replica). The Keras variable keeps its path and full
shape, so ``model.weights``, ``get_weights``, ``set_weights`` and
``.weights.h5`` files see the weight as one device would; a read joins the
shards (``tf.concat`` of each shard's local value, so a gradient taken
against the shards flows through it), and an assign splits the value. The
optimizer and the tape work on the shards, one Keras variable each
(``ShardView`` in ``hybridpar.compat.shard_views``), so the slots follow
them onto their devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_conversion_registry

from hybridpar.errors import ConfigError


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

    @property
    def _unique_id(self) -> str:
        """Raises ConfigError: only a ``tf.Variable`` has it, and a Keras optimizer reads it
        when given this weight whole (it keys its slots by it)."""
        raise ConfigError(
            f"Weight {self.name!r} is split over {len(self.variables)} devices "
            "(model_parallel.tensor), and an optimizer was given it whole "
            "(optimizer.build(model.trainable_variables) or apply_gradients by hand), so its "
            "slots would be whole. Let model.fit build the optimizer (one slot set per "
            "shard, on the shard's device), or restore a hybridpar checkpoint, which builds "
            "it the same way."
        )

    def __repr__(self) -> str:
        return (f"<SplitVariable {self.name} shape={self.shape.as_list()} axis={self.axis} "
                f"shards={len(self.variables)}>")


def _as_tensor(variable: SplitVariable, dtype: Any = None, name: str | None = None,
               as_ref: bool = False) -> tf.Tensor:
    value = variable.read_value()
    return value if dtype is None else tf.cast(value, dtype)


tensor_conversion_registry.register_tensor_conversion_function(SplitVariable, _as_tensor)


def _colocated_with(target: Any) -> Callable[..., Any]:
    """A variable creator that gives the strategy ``target`` as ``colocate_with``."""
    def creator(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        return next_creator(**{**kwargs, "colocate_with": target})

    return creator


def split_in_place(variable: Any, axis: int, colocations: Sequence[Any]) -> SplitVariable:
    """Stores a built Keras variable as shards, one per device of the group, same value.

    The current value is sliced along ``axis``; slice ``j`` becomes a variable
    created by the running strategy with ``colocations[j]`` as its
    ``colocate_with`` (so under a mirrored strategy it is mirrored over shard
    ``j``'s device of every replica), and the Keras variable's value becomes
    their ``SplitVariable``. The old variable is released.

    Args:
        variable: a Keras variable (its path and shape stay).
        axis: the axis to split.
        colocations: per shard, the ``colocate_with`` target of its device(s).

    Returns:
        The ``SplitVariable`` now held by ``variable``.
    """
    old = variable._value
    with tf.init_scope():
        pieces = tf.split(tf.identity(old.read_value()), len(colocations), axis)
        shards = []
        for index, (piece, colocation) in enumerate(zip(pieces, colocations, strict=True)):
            with tf.variable_creator_scope(_colocated_with(colocation)):
                shards.append(tf.Variable(
                    piece, trainable=old.trainable, name=f"{variable.name}_shard{index}",
                    aggregation=old.aggregation, synchronization=old.synchronization))
    split = SplitVariable(shards, axis, variable.name)
    variable._value = split
    return split

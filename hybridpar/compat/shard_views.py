"""Inside hybridpar's step, a Keras variable stored in shards is seen as one view per shard.

Upstream (Keras 3.15 + TF 2.21): a Keras variable built under a
ParameterServerStrategy with a ``variable_partitioner`` holds a
``ShardedVariable``, which has no ``handle``, so ``tape.gradient`` against
the Keras variable raises ``AttributeError: 'ShardedVariable' object has no
attribute 'handle'``; and the optimizer's slots, colocated with the whole
``ShardedVariable``, are created unsharded on the chief. Within
``shard_views(model)``, ``model.trainable_weights``/``trainable_variables``
list a ``ShardView`` per shard: the tape gets a real resource to
differentiate and the optimizer one slot set per shard, placed on that
shard's ps. The model's own ``train_step`` (also one a user overrides) runs
unchanged inside. A tensor-parallel weight (a Keras variable holding a
``hybridpar.parallel.split_variable.SplitVariable``) is listed the same way,
so its gradients and slots stay on the devices of its shards. Installed only
while a strategy hybridpar built that stores weights in shards is alive.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import keras
from tensorflow.python.distribute import sharded_variable

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.parallel.split_variable import SplitVariable


class ShardView(keras.Variable):
    """A Keras variable over one shard of a ``ShardedVariable`` or ``SplitVariable`` (no copy)."""

    def __init__(self, shard: Any, parent: keras.Variable, index: int) -> None:
        self._shard = shard
        super().__init__(
            initializer=lambda shape, dtype: None,
            shape=tuple(shard.shape),
            dtype=parent.dtype,
            trainable=parent.trainable,
            name=f"{parent.path.replace('/', '_')}_shard{index}",
        )

    def _initialize_with_initializer(self, initializer: Any) -> None:
        self._value = self._shard


_viewed_model: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hybridpar_viewed_model", default=None
)


def sharded(variable: Any) -> sharded_variable.ShardedVariable | None:
    """The ``ShardedVariable`` a Keras variable holds, or ``None``."""
    value = getattr(variable, "_value", None)
    return value if isinstance(value, sharded_variable.ShardedVariable) else None


def stored_in_shards(variable: Any) -> sharded_variable.ShardedVariable | SplitVariable | None:
    """The ``ShardedVariable`` or ``SplitVariable`` a Keras variable holds, or ``None``."""
    value = getattr(variable, "_value", None)
    return value if isinstance(value, (sharded_variable.ShardedVariable, SplitVariable)) else None


def views_of(variables: list[Any]) -> list[Any]:
    """``variables`` with each Keras variable stored in shards replaced by its shard views."""
    result = []
    for variable in variables:
        table = stored_in_shards(variable)
        if table is None:
            result.append(variable)
            continue
        views = getattr(variable, "_hybridpar_shard_views", None)
        if views is None:
            views = [ShardView(shard, variable, i) for i, shard in enumerate(table.variables)]
            variable._hybridpar_shard_views = views
        result.extend(views)
    return result


@contextlib.contextmanager
def shard_views(model: Any) -> Iterator[None]:
    """Within the block, ``model``'s trainable weights/variables list shard views."""
    token = _viewed_model.set(model)
    try:
        yield
    finally:
        _viewed_model.reset(token)


def _as_shard_views(original: property) -> property:
    def getter(self):
        variables = original.fget(self)
        if _viewed_model.get() is self:
            return views_of(variables)
        return variables

    return property(functools.wraps(original.fget)(getter), original.fset, original.fdel)


FIX = register(Fix(
    name="shard_views",
    corrects="tape.gradient against a sharded Keras variable fails ('no attribute handle') "
             "and its slots land unsharded on the chief",
    group="split_weights",
    patches=tuple(Patch(keras.layers.Layer, name, _as_shard_views)
                  for name in ("trainable_weights", "trainable_variables")),
))

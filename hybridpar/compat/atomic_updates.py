"""Inside a parameter-server step, Keras variables add and subtract atomically.

Upstream (Keras 3.15, ``keras/src/backend/common/variables.py``):
``assign_add(v)`` is ``assign(self + v)``, a read then a write. Under
parameter servers, workers update the same variables concurrently and
updates landing between the read and the write are lost: 20 scheduled steps
left ``optimizer.iterations`` at 15 here, and metric totals and weight
updates lose contributions the same way. TensorFlow's resource
``AssignAddVariableOp`` is atomic; within ``atomic_updates()`` (which
hybridpar's parameter-server step opens) it is used. Installed only while a
parameter-server strategy hybridpar built is alive.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from hybridpar.compat.patching import Fix, Patch, register

_atomic: contextvars.ContextVar[bool] = contextvars.ContextVar("hybridpar_atomic", default=False)


@contextlib.contextmanager
def atomic_updates() -> Iterator[None]:
    """Within the block, Keras variables' ``assign_add``/``assign_sub`` are single ops."""
    token = _atomic.set(True)
    try:
        yield
    finally:
        _atomic.reset(token)


def _updated_atomically(op: str) -> Any:
    def owns(self, *args, **kwargs) -> bool:
        return _atomic.get() and hasattr(getattr(self, "_value", None), op)

    return owns


def _atomic_update(op: str) -> Any:
    def wrap(original: Any) -> Any:
        def method(self, value):
            target = self._value
            return getattr(target, op)(tf.cast(value, target.dtype))

        return method

    return wrap


FIX = register(Fix(
    name="atomic_updates",
    corrects="Keras Variable.assign_add is a read then a write, losing concurrent updates",
    group="parameter_server",
    patches=tuple(Patch(keras.Variable, op, _atomic_update(op), owns=_updated_atomically(op))
                  for op in ("assign_add", "assign_sub")),
))

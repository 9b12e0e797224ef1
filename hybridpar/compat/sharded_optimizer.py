"""``data_parallel.shard_optimizer_state``: the optimizer's hooks for ZeRO stage 1.

Not an upstream defect: Keras 3 shards optimizer state on JAX only
(``keras.distribution``); under ``tf.distribute`` every replica holds every
slot (``TFOptimizer.add_variable_from_reference`` colocates each slot with
its mirrored variable, so a MirroredVariable over every device). For an
optimizer created under a strategy hybridpar built with sharding on
(``hybridpar.parallel.zero``), Keras 3.15's ``keras/src/backend/tensorflow/
optimizer.py`` and ``keras/src/optimizers/base_optimizer.py`` are changed in
three places:

- ``BaseOptimizer.build`` checks that the optimizer can be sharded and, after
  Keras's own bookkeeping, creates its shards and replica optimizers;
- ``TFOptimizer.add_variable_from_reference`` creates no slot (``None``; the
  optimizer's own ``update_step`` never runs) and tells the sharding which slot
  it was asked for (checkpoints store the shards as those slots);
- ``TFOptimizer._backend_update_step``, where Keras all-reduces the gradients
  and updates each variable in a ``merge_call``, runs the sharded update in
  the replica instead. This is the one call in the train step.

A ``LossScaleOptimizer`` (``mixed_float16``) keeps its scale and counter and
is not sharded itself: its inner optimizer is, and the update runs in the
branch the all-reduced finiteness check (``loss_scale_finiteness``) chose, so
every replica enters the collectives or none does.

The replica optimizers are not under the strategy (their variables are
plain), so none of this acts on them.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer
from keras.src.optimizers import base_optimizer, loss_scale_optimizer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.compat.replica_share import current_share
from hybridpar.state import state_of


def _sharding(optimizer: Any) -> Any:
    state = state_of(getattr(optimizer, "_distribution_strategy", None))
    return None if state is None else state.zero


def _owned(self: Any, *args: Any, **kwargs: Any) -> bool:
    return _sharding(self) is not None


def _in_replica(self: Any, *args: Any, **kwargs: Any) -> bool:
    return _owned(self) and tf.distribute.get_replica_context() is not None


def _build(original: Any) -> Any:
    def build(self, variables):
        if isinstance(self, loss_scale_optimizer.LossScaleOptimizer):
            return original(self, variables)  # it has no slots; its inner one is sharded
        sharding = _sharding(self)
        sharding.check(self)
        original(self, variables)
        sharding.build(self._distribution_strategy, self, list(variables))

    return build


def _no_slot(original: Any) -> Any:
    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        _sharding(self).note_slot(self, reference_variable, name or "var")
        return None

    return add_variable_from_reference


def _sharded_update(original: Any) -> Any:
    def backend_update_step(self, grads, trainable_variables, learning_rate):
        state = _sharding(self).state_for(self)
        variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
        indices = [self._get_variable_index(v) for v in trainable_variables]
        if len(indices) != len(state.shapes) or indices != sorted(indices):
            raise ValueError(
                "hybridpar: shard_optimizer_state needs a gradient for every trainable variable "
                f"the optimizer was built with ({len(state.shapes)}); received "
                f"{len(indices)}. Give every variable a gradient, or set "
                "data_parallel.shard_optimizer_state to false."
            )
        share = current_share()
        count = (share.local, share.nominal) if share is not None and share.nominal else None
        state.apply(list(grads), variables, learning_rate, count)

    return backend_update_step


FIX = register(Fix(
    name="sharded_optimizer",
    corrects="under tf.distribute every replica holds every optimizer slot (Keras shards "
             "optimizer state on JAX only)",
    group="core",
    patches=(
        Patch(base_optimizer.BaseOptimizer, "build", _build, owns=_owned),
        Patch(keras_tf_optimizer.TFOptimizer, "add_variable_from_reference", _no_slot,
              owns=_owned),
        Patch(keras_tf_optimizer.TFOptimizer, "_backend_update_step", _sharded_update,
              owns=_in_replica),
    ),
))

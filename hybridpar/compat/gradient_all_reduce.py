"""The gradient all-reduce of hybridpar's strategies: exact replica weights, one batch per stage.

Keras sums each step's gradients over the replicas in one batch all-reduce
(``TFOptimizer._all_reduce_sum_gradients``, Keras 3.15,
``keras/src/backend/tensorflow/optimizer.py``). Under a strategy hybridpar
built, this module does that all-reduce, correcting three upstream
behaviours:

- Partial batches: with ``data.global_batch_size`` (``B``) set and a dynamic
  batch, losses were scaled by ``local / B`` (``replica_share``); the
  replicas' example counts are summed in the same all-reduce as the
  gradients and the sums rescaled by ``B / total``, so every replica weighs
  ``local / total`` with no extra collective. On full batches the factor is 1.
- Stages (TF 2.21, ``cross_device_ops``): one batch all-reduce of values that
  live on different devices falls back to reducing them one by one, with a
  warning ("Efficient batch_reduce is not supported if destinations are
  different") on every trace, and its pack of values is joined on one
  device. With model-parallel stages each stage's gradients live on that
  stage's devices, and with tensor-parallel groups each shard's on its
  shard's devices, so they are reduced as one batch per set of devices,
  launched on those devices (``hybridpar.parallel.device_groups``: upstream
  launches every collective on the replica's first device); the example
  count goes with stage 0.
- A leak: the all-reduce goes through ``replica_all_reduce``, which keeps no
  strategy alive.

With ``communication.compression`` each stage group is all-reduced by
``hybridpar.parallel.compression`` instead (fp16/bf16 casts, PowerSGD).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.compat.replica_share import current_share
from hybridpar.parallel import all_reduce as replica_all_reduce
from hybridpar.parallel import device_groups
from hybridpar.state import StrategyState, state_of


def _on_device_of(value: Any) -> Any:
    return tf.device(value.device) if value.device else contextlib.nullcontext()


def _rescaled(gradient: Any, factor: tf.Tensor) -> Any:
    """``gradient`` times ``factor``, on the gradient's device (a stage's, a shard's)."""
    if isinstance(gradient, tf.IndexedSlices):
        with _on_device_of(gradient.values):
            values = gradient.values * tf.cast(factor, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    with _on_device_of(gradient):
        return gradient * tf.cast(factor, gradient.dtype)


def _local_devices(variable: Any) -> frozenset[str]:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return frozenset(
        f"/device:{spec.device_type}:{spec.device_index}"
        for spec in (tf.DeviceSpec.from_string(part.device)
                     for part in getattr(value, "values", [value]))
    )


def _exact(pairs: list[tuple[Any, Any]], group: Any = None) -> list[Any]:
    return replica_all_reduce.all_reduce_sum([gradient for gradient, _ in pairs], group=group)


def _by_stage(state: StrategyState, pairs: list[tuple[Any, Any]],
              reduce_group: Callable[[list[tuple[Any, Any]], Any], list[Any]]) -> list[Any]:
    """The all-reduced gradients of ``pairs``, one batch per group of devices (stage, shard),
    each launched on its own devices (``device_groups``)."""
    mesh = state.plan.mesh
    if state.stages == 1 and mesh.tensor == 1:
        return reduce_group(pairs, None)
    stage_0 = frozenset(mesh.stage_devices(0))
    groups: dict[frozenset[str], list[int]] = {}
    for index, (_, variable) in enumerate(pairs):
        key = stage_0 if variable is None else _local_devices(variable)
        groups.setdefault(key, []).append(index)
    collectives = device_groups.device_groups(tf.distribute.get_strategy(), mesh)
    reduced: list[Any] = [None] * len(pairs)
    for devices, indices in groups.items():
        group = None if devices == stage_0 else collectives.get(devices)
        values = reduce_group([pairs[i] for i in indices], group)
        for index, value in zip(indices, values, strict=True):
            reduced[index] = value
    return reduced


def reduce_gradients(state: StrategyState, grads_and_vars: list[tuple[Any, Any]],
                     optimizer: Any = None) -> list:
    """Keras's gradient all-reduce for a strategy hybridpar built (see the module doc).

    Args:
        state: the strategy's state.
        grads_and_vars: the replica's ``(gradient, variable)`` pairs.
        optimizer: the optimizer whose step this is (its compression state).
    """
    present = list(keras_tf_optimizer.filter_empty_gradients(grads_and_vars))
    if not present:
        return grads_and_vars
    share = current_share()
    counted = share is not None and share.nominal is not None
    compression = state.compression
    reduce_group = _exact if compression is None else compression.reducer(optimizer, present)
    reduced = _by_stage(state, [*present, (share.local, None)] if counted else present,
                        reduce_group)
    if counted:
        total = reduced.pop()
        factor = tf.math.divide_no_nan(tf.constant(share.nominal, tf.float32), total)
        reduced = [_rescaled(gradient, factor) for gradient in reduced]
    values = iter(reduced)
    return [(None if gradient is None else next(values), variable)
            for gradient, variable in grads_and_vars]


def _in_owned_replica(*args: Any, **kwargs: Any) -> bool:
    return (state_of(tf.distribute.get_strategy()) is not None
            and tf.distribute.get_replica_context() is not None)


def _owned_all_reduce(original: Any) -> Any:
    def all_reduce_sum_gradients(self, grads_and_vars):
        state = state_of(tf.distribute.get_strategy())
        return reduce_gradients(state, list(grads_and_vars), self)

    return all_reduce_sum_gradients


FIX = register(Fix(
    name="gradient_all_reduce",
    corrects="partial batches need the true example count; a batch all-reduce over several "
             "stages' devices falls back to one reduction per value",
    group="core",
    patches=(Patch(keras_tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients",
                   _owned_all_reduce, owns=_in_owned_replica),),
))

"""The gradient all-reduce of hybridpar's strategies: exact replica weights, one batch per stage.

Two upstream behaviours meet in ``TFOptimizer._all_reduce_sum_gradients``
(Keras 3.15, ``keras/src/backend/tensorflow/optimizer.py``), which sums each
step's gradients over the replicas in one batch all-reduce:

- With ``data.global_batch_size`` (``B``) set and a dynamic batch, losses
  were scaled by ``local / B`` (``replica_share``); the replicas' example
  counts are summed in the same all-reduce as the gradients and the sums are
  rescaled by ``B / total``, so every replica weighs ``local / total`` with no
  extra collective. On full batches ``total == B`` and the factor is 1.
- Upstream (TF 2.21, ``cross_device_ops``): one batch all-reduce of values
  that live on different devices falls back to reducing them one by one,
  with a warning ("Efficient batch_reduce is not supported if destinations
  are different") on every trace. With model-parallel stages each stage's
  gradients live on that stage's devices, so they are reduced as one batch
  per stage. The example count goes with stage 0.

Only optimizers stepping under a strategy hybridpar built take this path.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.compat.replica_share import current_share
from hybridpar.state import StrategyState, state_of


def _rescaled(gradient: Any, factor: tf.Tensor) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values * tf.cast(factor, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def _local_devices(variable: Any) -> frozenset[str]:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return frozenset(
        f"/device:{spec.device_type}:{spec.device_index}"
        for spec in (tf.DeviceSpec.from_string(part.device)
                     for part in getattr(value, "values", [value]))
    )


def _by_stage(original: Any, optimizer: Any, state: StrategyState, pairs: list) -> list:
    """``original`` over the pairs, one batch per group of devices (stage)."""
    if state.stages == 1:
        return original(optimizer, pairs)
    stage_0 = frozenset(state.plan.mesh.stage_devices(0))
    groups: dict[frozenset[str], list[int]] = {}
    for index, (_, variable) in enumerate(pairs):
        key = stage_0 if variable is None else _local_devices(variable)
        groups.setdefault(key, []).append(index)
    reduced: list[Any] = [None] * len(pairs)
    for indices in groups.values():
        group = original(optimizer, [pairs[i] for i in indices])
        for index, pair in zip(indices, group, strict=True):
            reduced[index] = pair
    return reduced


def _owned_all_reduce(original: Any) -> Any:
    @functools.wraps(original)
    def all_reduce_sum_gradients(self, grads_and_vars):
        state = state_of(tf.distribute.get_strategy())
        if state is None or tf.distribute.get_replica_context() is None:
            return original(self, grads_and_vars)
        pairs = list(grads_and_vars)
        share = current_share()
        if share is None or share.nominal is None:
            return _by_stage(original, self, state, pairs)
        reduced = list(_by_stage(original, self, state, [*pairs, (share.local, None)]))
        total = reduced.pop()[0]
        factor = tf.math.divide_no_nan(tf.constant(share.nominal, tf.float32), total)
        return [(_rescaled(gradient, factor), variable) for gradient, variable in reduced]

    return all_reduce_sum_gradients


FIX = register(Fix(
    name="gradient_all_reduce",
    corrects="partial batches need the true example count; a batch all-reduce over several "
             "stages' devices falls back to one reduction per value",
    group="core",
    patches=(Patch(keras_tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients",
                   _owned_all_reduce),),
))

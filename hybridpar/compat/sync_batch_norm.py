"""``BatchNormalization(synchronized=True)`` through hybridpar's collectives.

Upstream (Keras 3.15, ``_compute_moments_sync`` in
``keras/src/backend/tensorflow/nn.py``): synchronized batch norm sums its
statistics with three ``ReplicaContext.all_reduce`` calls. Each registers a
``tf.custom_gradient`` whose gradient function holds the replica context, and
so the strategy, in TensorFlow's global gradient registry for the life of the
process (``replica_all_reduce``); the variance is ``E[x^2] - E[x]^2``, which
loses precision against the two-pass ``tf.nn.moments`` of one device.

Under a strategy hybridpar built, the statistics over all replicas and
workers are computed in two all-reduces (the sums and counts, then the
squared deviations from the global mean, as ``tf.nn.moments`` does) through
``replica_all_reduce``, with a gradient that is itself an all-reduce and
looks the replica context up when it runs, so nothing keeps the strategy
alive. Padding of a split batch (``even_batches``) takes part in the
statistics like any example.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow import nn as keras_tf_nn

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.parallel import all_reduce as replica_all_reduce
from hybridpar.state import state_of


@tf.custom_gradient
def _summed_over_replicas(*values: tf.Tensor) -> Any:
    """The SUM all-reduce of ``values``; its gradient is the SUM all-reduce of the gradients."""

    def gradient(*upstream: tf.Tensor) -> list[tf.Tensor]:
        return replica_all_reduce.all_reduce_sum(list(upstream))

    return replica_all_reduce.all_reduce_sum(list(values)), gradient


def synchronized_moments(x: tf.Tensor, axes: list[int], keepdims: bool) -> tuple[Any, Any]:
    """Mean and variance of ``x`` over ``axes`` and over every replica in sync."""
    local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
    local_count = tf.reduce_sum(tf.ones_like(x), axis=axes, keepdims=True)
    total, count = _summed_over_replicas(local_sum, local_count)
    mean = tf.math.divide_no_nan(total, count)
    squared = tf.reduce_sum(tf.math.squared_difference(x, tf.stop_gradient(mean)), axis=axes,
                            keepdims=True)
    (total_squared,) = _summed_over_replicas(squared)
    variance = tf.math.divide_no_nan(total_squared, count)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


def _in_owned_replica(*args: Any, **kwargs: Any) -> bool:
    context = tf.distribute.get_replica_context()
    return context is not None and state_of(context.strategy) is not None


def _owned_moments(original: Any) -> Any:
    def compute_moments_sync(x, axes, keepdims):
        if tf.distribute.get_replica_context().num_replicas_in_sync == 1:
            return keras_tf_nn._compute_moments(x, axes, keepdims)
        return synchronized_moments(x, axes, keepdims)

    return compute_moments_sync


FIX = register(Fix(
    name="sync_batch_norm",
    corrects="synchronized batch norm all-reduces through ReplicaContext.all_reduce, whose "
             "registered gradients keep the strategy alive, and computes E[x^2] - E[x]^2",
    group="core",
    patches=(Patch(keras_tf_nn, "_compute_moments_sync", _owned_moments,
                     owns=_in_owned_replica),),
))

"""Replica all-reduces that keep no strategy alive.

Upstream (TF 2.21, ``ReplicaContextBase.all_reduce`` in
``tensorflow/python/distribute/distribute_lib.py``): every dense all-reduce is
wrapped in ``tf.custom_gradient``, which in graph mode registers its gradient
function in TensorFlow's global gradient registry, where it stays; the
function's closure holds the replica context and so the strategy. Once a
train step was traced, the strategy (and what it references) lives as long as
the process, and hybridpar's fixes, which are installed while a strategy of
theirs lives, could never be removed. Nothing differentiates through the
gradient all-reduce or the example count, so hybridpar runs those through the
same ``merge_call``/``batch_reduce_to`` path without the wrapper (the path
TensorFlow itself takes when a value is an ``IndexedSlices``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import collective_util, distribute_lib

from hybridpar.compat.patching import Fix, register

FIX = register(Fix(
    name="replica_all_reduce",
    corrects="every traced replica all-reduce registers a gradient that keeps its strategy "
             "alive for the life of the process",
    group="core",
))


def all_reduce_sum(values: list[Any]) -> list[Any]:
    """The replica-context SUM all-reduce of ``values``, without a registered gradient."""
    context = tf.distribute.get_replica_context()
    extended = context.strategy.extended
    options = collective_util.Options()
    if extended._use_merge_call():
        def batch_all_reduce(strategy: tf.distribute.Strategy, *flat: Any) -> Any:
            pairs = [(v, distribute_lib._batch_reduce_destination(v)) for v in flat]
            return strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs, options)

        return list(context.merge_call(batch_all_reduce, args=tuple(values)))
    return list(extended._replica_ctx_all_reduce(tf.distribute.ReduceOp.SUM, values, options))

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

Two more upstream limits are handled here:

- A batch all-reduce concatenates its values into one tensor per pack
  (``CollectiveReplicaLauncher.batch_all_reduce`` in
  ``tensorflow/python/distribute/cross_device_utils.py``), so values of two
  dtypes fail ("Tensors in list passed to 'values' of 'ConcatV2' Op have
  types [float32, float16]"): values are reduced in one batch per dtype.
- ``merge_call`` cannot run inside a ``tf.cond`` branch ("`merge_call` called
  while defining a new graph or a tf.function"), and MirroredStrategy and
  MultiWorkerMirroredStrategy use it for every all-reduce unless XLA compiles
  for GPUs only (``_use_merge_call``). ``in_branch=True`` launches the
  collectives from the replica itself, as those strategies do under XLA
  (``_replica_ctx_all_reduce``), so the call may sit in a branch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import collective_util, cross_device_ops, distribute_lib

from hybridpar.parallel import device_groups


def all_reduce_sum(values: list[Any], *, in_branch: bool = False,
                   group: cross_device_ops.CollectiveAllReduce | None = None) -> list[Any]:
    """The replica-context SUM all-reduce of ``values``, without a registered gradient.

    Args:
        values: tensors or ``IndexedSlices`` of this replica, of any dtypes
            (one batch per dtype).
        in_branch: launch the collectives without ``merge_call``, so that the
            call may run inside a ``tf.cond`` branch. This needs the strategy's
            ``CollectiveAllReduce`` (every hybridpar mirrored and multi-worker
            strategy has one); in eager mode, where ``tf.cond`` runs one branch
            in Python and replicas run one after another, the ``merge_call``
            path is taken.
        group: the collectives to launch on in a traced step, when ``values``
            live on other devices of the replica than the strategy's own
            (``hybridpar.parallel.device_groups``); eagerly, the strategy's.
    """
    groups: dict[Any, list[int]] = {}
    for index, value in enumerate(values):
        groups.setdefault(value.dtype, []).append(index)
    reduced: list[Any] = [None] * len(values)
    graph = not tf.executing_eagerly()
    for indices in groups.values():
        batch = [values[i] for i in indices]
        if graph and group is not None:
            results = _launched(batch, group)
        else:
            results = _launched(batch) if in_branch and graph else _merged(batch)
        for index, result in zip(indices, results, strict=True):
            reduced[index] = result
    return reduced


def _merged(values: list[Any]) -> list[Any]:
    context = tf.distribute.get_replica_context()
    extended = context.strategy.extended
    options = collective_util.Options()
    if extended._use_merge_call():
        def batch_all_reduce(strategy: tf.distribute.Strategy, *flat: Any) -> Any:
            pairs = [(v, distribute_lib._batch_reduce_destination(v)) for v in flat]
            return strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs, options)

        return list(context.merge_call(batch_all_reduce, args=tuple(values)))
    return list(extended._replica_ctx_all_reduce(tf.distribute.ReduceOp.SUM, values, options))


def _launched(values: list[Any],
              collectives: cross_device_ops.CollectiveAllReduce | None = None) -> list[Any]:
    context = tf.distribute.get_replica_context()
    if collectives is None:
        collectives = device_groups.strategy_collectives(context.strategy)
    if collectives is None:
        raise RuntimeError(
            f"{type(context.strategy).__name__} has no CollectiveAllReduce, so hybridpar cannot "
            "all-reduce inside a tf.cond branch."
        )
    return list(collectives._all_reduce(tf.distribute.ReduceOp.SUM, values, context._replica_id,
                                        collective_util.Options()))

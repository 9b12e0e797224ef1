"""A ``LossScaleOptimizer`` step is skipped when any replica's gradients overflow.

Upstream (Keras 3.15, ``LossScaleOptimizer._tf_apply`` in
``keras/src/optimizers/loss_scale_optimizer.py``, since keras-team/keras#18691):
under a strategy that uses ``merge_call`` (``MirroredStrategy`` and
``MultiWorkerMirroredStrategy``), each replica checks its own gradients,
before any all-reduce, and the step takes the first local replica's answer
("Each replica computed the same `finite` value, since `grads` is all-reduced
across replicas", which it is not). So:

- an overflow on any other replica is applied: the all-reduced gradients are
  inf or nan, every weight becomes non-finite and the loss scale is not lowered;
- over several workers each worker decides by its own first replica: a worker
  whose gradients overflow skips the step while the others enter its
  all-reduce, and the cluster waits for a collective that never comes.

For a ``LossScaleOptimizer`` created under a strategy hybridpar built,
``check_finite`` sums the replicas' counts of non-finite gradients in one
all-reduce of a scalar (launched from the replica, so that it may run inside
the ``merge_call``), and every replica of every worker takes the same branch:
the step is applied when all gradients of all replicas are finite, and skipped
(scale halved) otherwise. ZeRO's sharded update
(``hybridpar.parallel.zero``) relies on it: the update branch holds the
reduce-scatter and all-gather, which every replica must enter or none.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from keras.src.optimizers import loss_scale_optimizer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.parallel.all_reduce import all_reduce_sum
from hybridpar.state import state_of


def _owned_in_replica(self: Any, *args: Any, **kwargs: Any) -> bool:
    return (state_of(getattr(self, "_distribution_strategy", None)) is not None
            and tf.distribute.get_replica_context() is not None
            and tf.distribute.get_replica_context().num_replicas_in_sync > 1)


def _finite_everywhere(original: Any) -> Any:
    def check_finite(self, grads):
        local = tf.cast(tf.logical_not(original(self, grads)), tf.float32)
        (non_finite,) = all_reduce_sum([local], in_branch=True)
        return tf.equal(non_finite, 0.0)

    return check_finite


FIX = register(Fix(
    name="loss_scale_finiteness",
    corrects="a LossScaleOptimizer under MirroredStrategy or MultiWorkerMirroredStrategy "
             "skips a step by the first local replica's un-reduced gradients, so another "
             "replica's overflow is applied, and workers that disagree wait for each other "
             "for good",
    upstream="keras-team/keras#18691",
    group="core",
    patches=(Patch(loss_scale_optimizer.LossScaleOptimizer, "check_finite", _finite_everywhere,
                   owns=_owned_in_replica),),
))

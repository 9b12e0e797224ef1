"""Logged metrics under MultiWorkerMirroredStrategy are the mean over replicas.

Upstream (Keras 3.15, ``reduce_per_replica`` in
``keras/src/backend/tensorflow/trainer.py``): under
MultiWorkerMirroredStrategy, ``reduction="mean"``/``"auto"`` calls
``strategy.reduce("MEAN", v, axis=0)`` on each logged value; logs are
scalars, so every ``fit`` fails with "Invalid reduction dimension 0 for input
with 0 dimensions" (tensorflow/tensorflow#72388). The mean over replicas,
which is what the single-worker path computes (``reduce_mean(local_results,
axis=0)``), is ``axis=None``; it is taken for hybridpar's strategies.
"""

from __future__ import annotations

from typing import Any

from keras.src import tree
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import state_of


def _owned_mean(values, strategy, reduction) -> bool:
    return (reduction in ("auto", "mean") and state_of(strategy) is not None
            and keras_tf_trainer._collective_all_reduce_multi_worker(strategy))


def _mean_over_replicas(original: Any) -> Any:
    def reduce_per_replica(values, strategy, reduction):
        return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)

    return reduce_per_replica


FIX = register(Fix(
    name="metric_reduction",
    corrects="fit under MultiWorkerMirroredStrategy reduces scalar logs with axis=0 and fails",
    upstream="tensorflow/tensorflow#72388",
    group="core",
    patches=(Patch(keras_tf_trainer, "reduce_per_replica", _mean_over_replicas,
                     owns=_owned_mean),),
))

"""``fit``/``evaluate``/``predict`` learn input shapes from the dataset's spec, not a batch.

Upstream (Keras 3.15, ``TensorFlowTrainer._maybe_symbolic_build`` in
``keras/src/backend/tensorflow/trainer.py``): under any non-default strategy,
every ``fit``/``evaluate``/``predict`` pulls a real batch from a fresh
iterator just to learn input shapes, and ``strategy.reduce("MEAN", batch)``s
it. That (a) consumes one pass of a reshuffling dataset, so distributed
training sees another data order than single-device training with the same
seed, (b) costs an extra iterator (prefetch fill) per call, and (c) raises
under MultiWorkerMirroredStrategy, where reducing a nested PerReplica batch
fails (keras-team/keras#20585). The symbolic build needs only shapes and
dtypes, which the distributed dataset's ``element_spec`` already has; models
under a strategy hybridpar built use it.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.data import balanced
from hybridpar.state import state_of


def _per_replica_spec(spec: Any) -> Any:
    """The spec one replica sees, from a (possibly PerReplica) element spec."""
    value_specs = getattr(spec, "_value_specs", None)
    return value_specs[0] if value_specs else spec


def _from_specs(original: Any) -> Any:
    @functools.wraps(original)
    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        dataset = getattr(iterator, "_distributed_dataset", None)
        if state_of(self._distribute_strategy) is None or dataset is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        specs = tf.nest.map_structure(
            _per_replica_spec, dataset.element_spec, expand_composites=False
        )
        if isinstance(specs, balanced.ReplicaBatch):  # a balanced piece (even_batches)
            specs = specs.data
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=specs)

    return maybe_symbolic_build


FIX = register(Fix(
    name="symbolic_build",
    corrects="every fit/evaluate/predict under a strategy pulls and reduces a real batch "
             "to learn shapes",
    upstream="keras-team/keras#20585",
    group="core",
    patches=(Patch(keras_tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", _from_specs),),
))

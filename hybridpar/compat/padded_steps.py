"""Padding of a split batch adds nothing to ``evaluate``'s figures or ``predict``'s rows.

Not an upstream defect but the other half of ``even_batches``: a final batch
with fewer examples than replicas is padded so no replica is empty, and the
padding must then vanish again. Keras 3.15's own steps
(``keras/src/backend/tensorflow/trainer.py``) cannot tell padding from data:
``test_step`` counts every row in its loss tracker
(``sample_weight=tf.shape(x)[0]``) and compiled ``metrics`` ignore sample
weights, and ``predict`` concatenates every replica's rows.

For models under a replicated strategy hybridpar built, the trainer
(``hybridpar.training``, through ``trainer_hooks``) runs these when a replica
holds a padded piece (its ``replica_share.Share`` has a keep mask):

- ``padded_test_step`` (the trainer's ``test_step``) counts only the kept
  examples in the loss tracker and leaves padding out of the metrics; the
  user's sample weights, of any rank, reach the loss as on one device (the
  train step does the same, ``microbatch_step``);
- ``predict_function`` (the trainer's ``make_predict_function``) is Keras's
  predict function with each
  replica's outputs cut to its kept rows, so ``predict`` returns exactly the
  input's rows, in order, whatever ``predict_step`` the model has; it is
  traced once for any batch size (Keras's traces again for a smaller final
  batch, a second trace of the whole model).

Everything else, and every model of another strategy, runs Keras's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from keras.src.trainers.data_adapters import data_adapter_utils
from tensorflow.python.distribute import values as distribute_values

from hybridpar.compat import replica_share
from hybridpar.compat.patching import Fix, register
from hybridpar.data import balanced
from hybridpar.parallel import pipeline


def padded_test_step(model: Any, data: Any, keep: tf.Tensor) -> Any:
    """Keras 3.15's ``test_step`` on a padded piece: padding has no weight anywhere.

    The user's sample weights reach the loss unchanged (a piece is all input or one
    row of padding); a piece of padding counts 0 examples in the loss tracker.
    """
    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=False) if model._call_has_training_arg else model(x)
    loss = model._compute_loss(
        x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
    )
    rows = tf.shape(next(t for t in tree.flatten(x) if t is not None))[0]
    value, weight = pipeline.tracked_loss(loss, rows, tf.reduce_sum(keep))
    model._loss_tracker.update_state(value, sample_weight=weight)
    y, y_pred, sample_weight = balanced.kept_rows((y, y_pred, sample_weight), keep)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def predict_function(model: Any) -> Callable[[Any], Any]:
    """Keras 3.15's predict function, each replica's outputs cut to its kept rows."""
    strategy = model.distribute_strategy
    predict_step = model.predict_step
    if not model.run_eagerly and model.jit_compile:
        predict_step = tf.function(predict_step, reduce_retracing=True, jit_compile=True)

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data):
        outputs = predict_step(data)
        keep = replica_share.current_keep()
        return outputs if keep is None else balanced.kept_rows(outputs, keep)

    one_step_on_data = model._autoconvert_optionals(one_step_on_data)

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data_distributed(data):
        outputs = strategy.run(one_step_on_data, args=(data[0],))
        return keras_tf_trainer.reduce_per_replica(outputs, strategy, reduction="concat")

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_data(data):
        outputs = one_step_on_data_distributed(data[:1])
        for single_step_data in data[1:]:
            step_outputs = one_step_on_data_distributed([single_step_data])
            outputs = tree.map_structure(
                lambda t1, t2: keras_tf_trainer.concat([t1, t2]), outputs, step_outputs
            )
        return outputs

    function = multi_step_on_data if model.steps_per_execution > 1 else (
        one_step_on_data_distributed)
    if model.run_eagerly:
        return function
    traced = tf.function(function, reduce_retracing=True)

    def predict(data):
        if traced.experimental_get_tracing_count() == 0:
            traced.get_concrete_function(_any_batch_size(data))
        return traced(data)

    return predict


def _any_batch_size(data: Any) -> Any:
    """The type specs of ``data`` with every dense tensor's leading size unknown.

    Keras calls the predict function with the batch's tensors, so its first trace is
    for the first batch's shape and a smaller final batch traces it again; traced
    for any batch size at first, it is traced once.
    """

    def relaxed(value: Any) -> Any:
        spec = tf.type_spec_from_value(value)
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
            return tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)
        return spec

    def spec_of(value: Any) -> Any:
        if isinstance(value, distribute_values.PerReplica):
            return distribute_values.PerReplicaSpec(*map(relaxed, value.values))
        return relaxed(value)

    return tf.nest.map_structure(spec_of, data)


FIX = register(Fix(
    name="padded_steps",
    corrects="Keras's test step and predict count every row, so padding that keeps replicas "
             "from being empty would enter the figures and the outputs",
    group="core",
    part_of="trainer_hooks",
))

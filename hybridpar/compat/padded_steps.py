"""Padding of a split batch adds nothing to ``evaluate``'s figures or ``predict``'s rows.

Not an upstream defect but the other half of ``even_batches``: a final batch
with fewer examples than replicas is padded so no replica is empty, and the
padding must then vanish again. Keras 3.15's own steps
(``keras/src/backend/tensorflow/trainer.py``) cannot tell padding from data:
``test_step`` counts every row in its loss tracker
(``sample_weight=tf.shape(x)[0]``) and compiled ``metrics`` ignore sample
weights, and ``predict`` concatenates every replica's rows.

For models under a replicated strategy hybridpar built, when a replica holds
a padded piece (its ``replica_share.Share`` has a keep mask):

- ``TensorFlowTrainer.test_step`` gives padding sample weight 0, counts only
  the kept examples in the loss tracker and leaves padding out of the
  metrics (the train step does the same, ``microbatch_step``);
- ``make_predict_function`` builds Keras's predict function with each
  replica's outputs cut to its kept rows, so ``predict`` returns exactly the
  input's rows, in order, whatever ``predict_step`` the model has; it is
  traced once for any batch size (Keras's traces again for a smaller final
  batch, a second trace of the whole model).

Everything else, and every model of another strategy, runs Keras's own code.
This fix owns the one patch of ``make_predict_function``: a model it does not
build the function of goes on to ``model_scope``'s check, then to Keras's (one
patch for both, as ``microbatch_step`` explains for ``make_train_function``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from keras.src.trainers.data_adapters import data_adapter_utils
from tensorflow.python.distribute import values as distribute_values

from hybridpar.compat import model_scope, replica_share
from hybridpar.compat.patching import Fix, Patch, compose, guarded, register
from hybridpar.data import balanced
from hybridpar.parallel import pipeline
from hybridpar.state import state_of


def _keep() -> tf.Tensor | None:
    share = replica_share.current_share()
    return None if share is None else share.keep


def padded_test_step(model: Any, data: Any, keep: tf.Tensor) -> Any:
    """Keras 3.15's ``test_step`` on a padded piece: padding has no weight anywhere."""
    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    sample_weight = balanced.row_weighted(sample_weight, keep)
    y_pred = model(x, training=False) if model._call_has_training_arg else model(x)
    loss = model._compute_loss(
        x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
    )
    rows = tf.shape(next(t for t in tree.flatten(x) if t is not None))[0]
    value, weight = pipeline.tracked_loss(loss, rows, tf.reduce_sum(keep))
    model._loss_tracker.update_state(value, sample_weight=weight)
    y, y_pred, sample_weight = balanced.kept_rows((y, y_pred, sample_weight), keep)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _padded_piece(self, *args, **kwargs) -> bool:
    return _keep() is not None and state_of(self._distribute_strategy) is not None


def _owned_test_step(original: Any) -> Any:
    def test_step(self, data):
        return padded_test_step(self, data, _keep())

    return test_step


def predict_function(model: Any) -> Callable[[Any], Any]:
    """Keras 3.15's predict function, each replica's outputs cut to its kept rows."""
    strategy = model.distribute_strategy
    predict_step = model.predict_step
    if not model.run_eagerly and model.jit_compile:
        predict_step = tf.function(predict_step, reduce_retracing=True, jit_compile=True)

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data):
        outputs = predict_step(data)
        keep = _keep()
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


def _replicated(self, *args: Any, **kwargs: Any) -> bool:
    state = state_of(self._distribute_strategy)
    return state is not None and state.mode != "parameter_server"


def _owned_predict_function(original: Any) -> Any:
    def make_predict_function(self, force=False):
        if self.predict_function is None or force:
            self.predict_function = predict_function(self)
        return self.predict_function

    return make_predict_function


FIX = register(Fix(
    name="padded_steps",
    corrects="Keras's test step and predict count every row, so padding that keeps replicas "
             "from being empty would enter the figures and the outputs",
    group="core",
    patches=(
        Patch(keras_tf_trainer.TensorFlowTrainer, "test_step", _owned_test_step,
              owns=_padded_piece),
        Patch(keras_tf_trainer.TensorFlowTrainer, "make_predict_function", compose(
            guarded(_owned_predict_function, _replicated),
            model_scope.checked_step("predict"),
        )),
    ),
))

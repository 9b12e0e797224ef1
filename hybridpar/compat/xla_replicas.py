"""``model.compile(jit_compile=True)`` under hybridpar's replicated strategies.

Upstream (Keras 3.15, ``TensorFlowTrainer._make_function`` in
``keras/src/backend/tensorflow/trainer.py``): ``jit_compile=True`` compiles
the whole distributed step, ``strategy.run`` over every replica included,
as one XLA program for one device. Under ``MirroredStrategy`` the first
step fails ("Trying to access resource .../replica_1/... located in device
CPU:1 from device CPU:0"). Compiling each replica's own ``train_step``
instead (as tf_keras did) fails as well: the optimizer's gradient
all-reduce is a ``merge_call``, which cannot run inside a function
compiled per replica. (Keras's default ``jit_compile="auto"`` is False under
any strategy, ``_resolve_auto_jit_compile``; that is left as it is.)

Under hybridpar's mirrored and multi-worker strategies each replica runs
Keras's ``train_step`` in two parts: the forward pass, the loss and the
gradients, compiled by XLA for the replica's device, then the gradient
all-reduce with the optimizer update and the metrics outside XLA. The
test step (no all-reduce) is compiled per replica whole. One-device
strategies keep Keras's own compilation of the whole step. What XLA
cannot compile is refused before the first step, naming the mode and the
reason: model-parallel stages (one replica's step spans several devices),
microbatches (hybridpar's own step), and a model class with its own
``train_step`` (its all-reduce would sit inside the compiled function).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from keras.src.losses import loss as keras_loss
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.compat import replica_share
from hybridpar.compat.microbatch_step import own_train_step
from hybridpar.compat.patching import Fix, register
from hybridpar.errors import ConfigError
from hybridpar.parallel import moving_statistics
from hybridpar.state import StrategyState, state_of

FIX = register(Fix(
    name="xla_replicas",
    corrects="jit_compile=True compiles every replica's step as one program for one device",
    group="core",
))

_REPLICATED = ("mirrored", "multi_worker")
_FIX_HINT = "Compile with jit_compile=False (or 'auto'), or"


def check(model: Any, state: StrategyState) -> None:
    """Refuses ``jit_compile=True`` where XLA cannot compile the step, before training.

    Raises:
        ConfigError: naming the mode and why.
    """
    if not model.jit_compile:
        return
    mode = f"data_parallel.mode={state.mode!r}"
    if state.stages > 1:
        raise ConfigError(
            f"model.compile(jit_compile=True) cannot compile a model-parallel step ({mode}): "
            f"XLA compiles a replica's step for one device, and model_parallel.stages="
            f"{state.stages} places it on {state.stages} devices. {_FIX_HINT} set "
            "model_parallel.stages to 1."
        )
    if state.microbatches > 1:
        raise ConfigError(
            f"model.compile(jit_compile=True) cannot compile hybridpar's microbatched step "
            f"({mode}, model_parallel.microbatches={state.microbatches}). {_FIX_HINT} set "
            "model_parallel.microbatches to 1."
        )
    custom = own_train_step(model)
    if custom is not None and state.mode in _REPLICATED:
        raise ConfigError(
            f"model.compile(jit_compile=True) cannot compile {custom.__qualname__}.train_step "
            f"under {mode}: XLA compiles each replica's step, and the gradient all-reduce "
            f"inside a train_step of its own cannot run in a compiled function. {_FIX_HINT} "
            "use Keras's train_step (remove the override)."
        )


def _first_tensor(structure: Any) -> tf.Tensor:
    return next(t for t in tf.nest.flatten(structure) if t is not None)


def _count_examples_first() -> None:
    """All-reduces the replica's example count (if its share needs it) outside XLA."""
    share = replica_share.current_share()
    if share is not None:
        share.total()


def compiled_train_step(model: Any) -> Callable[[Any], Any]:
    """Keras 3.15's ``TensorFlowTrainer.train_step`` with its gradients computed by XLA."""

    @tf.autograph.experimental.do_not_convert
    def gradients(x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            tracked = keras_loss.unscale_loss_for_distribution(loss)
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        return tracked, y_pred, tape.gradient(loss, model.trainable_weights)

    compiled = tf.function(gradients, jit_compile=True, reduce_retracing=True)

    @tf.autograph.experimental.do_not_convert
    def train_step(data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        _count_examples_first()
        tracked, y_pred, grads = compiled(x, y, sample_weight)
        model._loss_tracker.update_state(tracked, sample_weight=tf.shape(_first_tensor(x))[0])
        if model.trainable_weights:
            model.optimizer.apply_gradients(zip(grads, model.trainable_weights, strict=True))
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def one_step_on_data(model: Any, step_function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One distributed step of ``step_function`` on a batch, compiled as ``jit_compile`` asks.

    Keras's ``one_step_on_data`` (``strategy.run``, then ``reduce_per_replica``),
    except that under replicated strategies XLA compiles inside each replica and
    a training step ends with batch norm's moving statistics averaged over the
    replicas (``moving_statistics``).
    """
    strategy = model.distribute_strategy
    state = state_of(strategy)
    check(model, state)
    replica_step, whole = step_function, bool(model.jit_compile)
    if model.jit_compile and state.mode in _REPLICATED:
        whole = False
        if step_function == model.train_step:
            replica_step = compiled_train_step(model)
        else:
            compiled = tf.function(step_function, jit_compile=True, reduce_retracing=True)

            def replica_step(data):  # a plain function: the strategy weights it by its share
                _count_examples_first()
                return compiled(data)

    averages_statistics = state.mode in _REPLICATED and step_function == model.train_step

    @tf.autograph.experimental.do_not_convert
    def one_step(data):
        outputs = strategy.run(replica_step, args=(data,))
        if averages_statistics:
            moving_statistics.average_copies(
                strategy, moving_statistics.replica_local_statistics(model)
            )
        return keras_tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    traced = tf.function(one_step, reduce_retracing=True, jit_compile=whole)
    return model._autoconvert_optionals(traced)

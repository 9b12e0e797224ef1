"""Microbatches: GPipe-style pipelining over stages, and gradient accumulation.

With ``model_parallel.microbatches: M`` each replica's batch is split into M
microbatches (sizes differing by at most one, so a final partial batch
splits too). Each runs forward and backward on its own tape; the gradients
are summed, each microbatch's loss weighted by its share of the examples,
and applied once, so a step is numerically the unsplit step.

* With stages > 1 nothing orders the microbatches: TensorFlow runs an op as
  soon as its inputs are ready, on the op's device, so stage 1 works on
  microbatch i while stage 0 works on microbatch i + 1 (the GPipe schedule;
  a microbatch's backward may start before the last forward, as in 1F1B).
* With one stage the microbatches run one after another (each waits for the
  previous one's gradients): gradient accumulation, a large batch in the
  memory of a small one.
* With stages > 1, each Dense-style weight gradient is computed once per
  batch from the concatenated microbatch activations and output gradients
  (``weight_gradients``); the activation gradients still flow per
  microbatch, so the stages still overlap.

Layers whose output depends on the whole batch see one microbatch at a
time: BatchNormalization normalises each microbatch with its own statistics
and updates its moving statistics once per microbatch (M times per step), as
in GPipe.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf
from keras.src.losses import loss as keras_loss
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.data import balanced
from hybridpar.parallel import one_f_one_b, output_records
from hybridpar.parallel.one_f_one_b import StageGates
from hybridpar.parallel.weight_gradients import DeferredWeightGradients


def microbatch_scope_name(index: int) -> str:
    """The TF name scope of microbatch ``index``'s forward and backward ops."""
    return f"microbatch{index}"


def _first_tensor(structure: Any) -> tf.Tensor:
    return next(t for t in tf.nest.flatten(structure) if t is not None)


def split_batch(structure: Any, microbatches: int) -> list[Any]:
    """Splits every tensor of ``structure`` along axis 0 into ``microbatches``
    parts whose sizes differ by at most one (larger ones first)."""
    total = tf.shape(_first_tensor(structure))[0]
    base, extra = total // microbatches, total % microbatches
    sizes = base + tf.cast(tf.range(microbatches) < extra, total.dtype)

    def split(tensor: Any) -> list[Any]:
        if tensor is None:
            return [None] * microbatches
        return tf.split(tensor, sizes, num=microbatches, axis=0)

    pieces = [split(tensor) for tensor in tf.nest.flatten(structure)]
    return [
        tf.nest.pack_sequence_as(structure, [parts[index] for parts in pieces])
        for index in range(microbatches)
    ]


def _add(total: Any, gradient: Any) -> Any:
    """Sums two gradients on the device that computed them (the stage's)."""
    if total is None or gradient is None:
        return gradient if total is None else total
    with tf.device(gradient.device):
        if isinstance(total, tf.IndexedSlices) and isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.concat([total.values, gradient.values], 0),
                tf.concat([total.indices, gradient.indices], 0),
                total.dense_shape,
            )
        return tf.convert_to_tensor(total) + tf.convert_to_tensor(gradient)


def _waits_for(tensors: list[Any], structure: Any) -> Any:
    """``structure`` with each tensor made to wait for ``tensors``."""
    with tf.control_dependencies(tensors):
        return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), structure)


def tracked_loss(loss: tf.Tensor, rows: tf.Tensor, kept: tf.Tensor | None) -> tuple[Any, Any]:
    """The value and weight for Keras's loss tracker of a (micro)batch's mean loss.

    Keras weighs the mean by the batch's rows; with padding (``kept`` real
    examples among ``rows``) the mean over the real examples is weighed by
    their count, so the padding adds nothing to the reported loss.
    """
    unscaled = keras_loss.unscale_loss_for_distribution(loss)
    if kept is None:
        return unscaled, rows
    factor = tf.math.divide_no_nan(tf.cast(rows, tf.float32), kept)
    return unscaled * tf.cast(factor, unscaled.dtype), kept


def train_step(model: keras.Model, data: Any, microbatches: int, sequential: bool,
               keep: tf.Tensor | None = None, schedule: str = "gpipe", stages: int = 1) -> Any:
    """Keras's ``train_step`` over ``microbatches`` microbatches, and over padded pieces.

    It follows Keras 3.15's own ``TensorFlowTrainer.train_step`` (the loss
    through ``_compute_loss``, the loss tracker, ``optimizer.scale_loss``,
    ``compute_metrics``), so that a microbatched step reports and updates
    what the unsplit one does.

    Args:
        model: the model being trained.
        data: one replica's batch, as Keras passes it.
        microbatches: the number of microbatches.
        sequential: run the microbatches one after another (gradient
            accumulation) instead of letting the stages overlap them.
        keep: the replica's keep mask when its batch is a padded piece
            (``hybridpar.data.balanced``): a microbatch of padding adds nothing
            to the gradients, the metrics or the loss tracker. A batch of dynamic
            size with fewer examples than microbatches is padded the same way,
            so that no microbatch is empty.
        schedule: ``gpipe``, or ``1f1b`` to order the ``stages`` stages'
            forwards after earlier backwards (``one_f_one_b``); 1F1B computes
            each microbatch's weight gradients with its backward, since
            deferring them would keep every microbatch's activations.

    Returns:
        The metrics, as Keras's ``train_step`` returns them.
    """
    x, y, sample_weight, keep = _padded(data, microbatches, keep)
    total = (tf.cast(tf.shape(_first_tensor(x))[0], tf.float32) if keep is None
             else tf.reduce_sum(keep))  # the examples that count
    weights = model.trainable_weights
    gates = StageGates(stages) if schedule == "1f1b" else None
    deferred = None if sequential or gates is not None else DeferredWeightGradients()
    accumulated: list[Any] = [None] * len(weights)
    predictions, tapes, previous = [], [], []
    for index, (xi, yi, wi, ki) in enumerate(split_batch((x, y, sample_weight, keep),
                                                         microbatches)):
        xi = _waits_for(previous, xi) if previous else xi
        with tf.name_scope(microbatch_scope_name(index)) as scope:
            with (tf.GradientTape(persistent=deferred is not None) as tape,
                  one_f_one_b.forward(gates, index)):
                y_pred = model(xi, training=True) if model._call_has_training_arg else model(xi)
                with output_records.covering(_examples(xi, ki), microbatches):
                    loss = _weighted_loss(model, xi, yi, wi, ki, y_pred, total)
            with one_f_one_b.backward(gates, index, scope), (
                    contextlib.nullcontext() if deferred is None else deferred.recording(index)):
                gradients = tape.gradient(loss, weights)
                accumulated = [_add(a, g) for a, g in zip(accumulated, gradients, strict=True)]
        predictions.append(y_pred)
        tapes.append(tape)
        if sequential:
            previous = [g.values if isinstance(g, tf.IndexedSlices) else g
                        for g in gradients if g is not None]
    if deferred is not None and weights:
        once = deferred.gradients(tapes, weights)
        accumulated = [_add(a, g) for a, g in zip(accumulated, once, strict=True)]
    if weights:
        model.optimizer.apply_gradients(zip(accumulated, weights, strict=True))
    return _metrics(model, (x, y, sample_weight, keep), predictions)


def _metrics(model: keras.Model, batch: tuple[Any, ...], predictions: list[Any]) -> Any:
    """Keras's metrics of the whole batch from its microbatches' predictions."""
    x, y, sample_weight, keep = batch
    y_pred = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *predictions)
    if keep is not None:
        y, y_pred, sample_weight = balanced.kept_rows((y, y_pred, sample_weight), keep)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _padded(data: Any, microbatches: int, keep: tf.Tensor | None) -> tuple[Any, ...]:
    """``(x, y, sample_weight, keep)`` of a batch, padded so no microbatch is empty.

    The user's sample weights pass unchanged (any rank: per example, per token,
    per pixel), so Keras reduces each loss as it would on one device; padding is
    weighted out by its microbatch's share of the examples (``_weighted_loss``).
    A padded batch holds fewer rows than microbatches, so each of its
    microbatches is one row: all input or all padding.
    """
    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    first = _first_tensor(x)
    if keep is None and microbatches > 1 and first.shape[0] is None:
        keep = tf.ones([tf.shape(first)[0]])  # a final batch may hold fewer than M examples
    if keep is not None and microbatches > 1:
        (x, y, sample_weight, keep), extra = balanced.padded_to(
            (x, y, sample_weight, keep), microbatches
        )
        keep = keep * extra
    return x, y, sample_weight, keep


def _examples(x: Any, keep: Any) -> tf.Tensor:
    """The examples a microbatch holds: its kept rows, else all of them."""
    if keep is not None:
        return tf.reduce_sum(keep)
    return tf.cast(tf.shape(_first_tensor(x))[0], tf.float32)


def _weighted_loss(model: keras.Model, x: Any, y: Any, sample_weight: Any, keep: Any,
                   y_pred: Any, total: tf.Tensor) -> tf.Tensor:
    """A microbatch's loss weighted by its share of the ``total`` examples, tracked by Keras.

    The share counts the microbatch's kept examples, so a microbatch of padding
    weighs 0 whatever the rank of its loss or of the sample weights.
    """
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)
    size = tf.shape(_first_tensor(x))[0]
    value, weight = tracked_loss(loss, size, None if keep is None else tf.reduce_sum(keep))
    model._loss_tracker.update_state(value, sample_weight=weight)
    counted = _examples(x, keep)
    loss = loss * tf.cast(tf.math.divide_no_nan(counted, total), loss.dtype)
    if model.optimizer is not None:
        loss = model.optimizer.scale_loss(loss)
    return loss

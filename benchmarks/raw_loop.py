"""The raw custom training step the benchmarks compare ``model.fit`` with.

It is the step of TensorFlow's multi-worker custom-training-loop tutorial:
``strategy.run`` of a tape step whose loss is ``compute_average_loss`` over
the global batch, then ``strategy.reduce(SUM)`` of the per-replica losses.
"""

from __future__ import annotations

from typing import Any


def custom_train_step(strategy: Any, model: Any, optimizer: Any,
                      global_batch_size: int) -> Any:
    """A ``tf.function(iterator) -> loss`` that trains ``model`` one step per call.

    Args:
        strategy: the ``tf.distribute`` strategy the model and optimizer were built in.
        model: a Keras classifier returning logits.
        optimizer: a built Keras optimizer of ``model``'s trainable variables.
        global_batch_size: the examples per step over all replicas.
    """
    import keras
    import tensorflow as tf

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(y, model(x, training=True)),
                                              global_batch_size=global_batch_size)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator: Any) -> Any:
        per_replica = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step

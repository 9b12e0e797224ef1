"""``steps_per_execution > 1`` under hybridpar's replicated strategies.

Upstream (Keras 3.15, ``TensorFlowTrainer._make_function`` in
``keras/src/backend/tensorflow/trainer.py``; keras-team/keras#19246): with
``steps_per_execution > 1`` the traced loop runs each step inside a
``tf.cond`` (whether the next batch exists) inside a ``tf.while_loop``.
Under ``MirroredStrategy`` the replica threads' ``merge_call`` (the gradient
all-reduce) inside that ``cond`` builds a graph that cannot run: ``fit``
fails on its first execution with "You must feed a value for placeholder
tensor 'while/cond/Placeholder'", with or without a partial last batch.

hybridpar's loop (used by ``optional_outputs`` for models under its
strategies) never puts a step inside a ``cond``: the first step of an
execution runs unconditionally (``get_next``; no data left ends the epoch
as in Keras), then a ``tf.while_loop`` whose condition is "fewer than
``steps_per_execution`` steps and the next batch exists" runs the rest, each
iteration fetching the next batch as an Optional at its end (the ``cond`` is
around the fetch only, and skipped after the last step so no batch is drawn
that the execution will not train). An execution that meets the end of the
data trains the batches that exist and returns the last step's logs, as
Keras's does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hybridpar.compat.patching import Fix, register

FIX = register(Fix(
    name="step_loop",
    corrects="steps_per_execution > 1 runs each step inside a tf.cond; under MirroredStrategy "
             "that graph cannot run",
    upstream="keras-team/keras#19246",
    group="core",
    part_of="trainer_hooks",
))


def multi_step_on_iterator(model: Any, one_step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The function that trains up to ``model.steps_per_execution`` batches per call
    (to be traced).

    Args:
        model: the model (its ``steps_per_execution`` is read when tracing).
        one_step: one distributed step on one batch, returning the logs.
    """

    @tf.autograph.experimental.do_not_convert
    def run(iterator):
        steps = model.steps_per_execution
        outputs = one_step(iterator.get_next())

        def proceed(done, outputs, next_batch):
            return tf.logical_and(done < steps, next_batch.has_value())

        def body(done, outputs, next_batch):
            outputs = one_step(next_batch.get_value())
            # The last step of the execution draws no batch (the condition then stops).
            following = tf.cond(done + 1 < steps, iterator.get_next_as_optional,
                                lambda: next_batch)
            return done + 1, outputs, following

        next_batch = iterator.get_next_as_optional()

        _, outputs, _ = tf.while_loop(
            proceed, body, (tf.constant(1), outputs, next_batch), parallel_iterations=1
        )
        return outputs

    return run

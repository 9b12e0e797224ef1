"""``communication.compression`` creates its state before the first training step.

Not an upstream defect: ``tf.distribute`` has no gradient compression
(``CommunicationOptions`` holds pack size, timeout and implementation only;
tensorflow/tensorflow#40468 was closed as stale). hybridpar compresses in its
own gradient all-reduce (``gradient_all_reduce`` hands each stage group to
``hybridpar.parallel.compression``). PowerSGD needs per-replica variables
(error memory and warm-start factors). ``make_train_function``, the point
after Keras built the model and its optimizer (``fit``, ``train_on_batch``)
and before the first trace, creates them eagerly for models under a strategy
hybridpar built with ``compression: powersgd``, so that the traced step
creates no variables. (A custom training loop gets them from its first step,
through ``merge_call``; checkpoint restores create them too.)
"""

from __future__ import annotations

import functools
from typing import Any

from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import state_of


def _prepared(original: Any) -> Any:
    @functools.wraps(original)
    def make_train_function(self, force=False):
        state = state_of(self._distribute_strategy)
        if state is not None and state.compression is not None:
            state.compression.prepare(self)
        return original(self, force)

    return make_train_function


FIX = register(Fix(
    name="gradient_compression",
    corrects="tf.distribute has no gradient compression; PowerSGD's per-replica state must "
             "exist before the train step is traced",
    group="core",
    patches=(Patch(keras_tf_trainer.TensorFlowTrainer, "make_train_function", _prepared),),
    upstream="tensorflow/tensorflow#40468",
))

"""A dataset of single examples is batched where Keras counts an epoch's steps.

Upstream (Keras 3.15, ``TFEpochIterator``): Keras counts the steps of an
epoch from the dataset it is given, before the strategy sees it, so a dataset
of single examples has to be batched where ``fit``/``evaluate``/``predict``
(and validation data) enter, for the progress bar to count the real steps.
hybridpar batches it by ``data.global_batch_size`` there, for strategies it
built; batched datasets pass unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.data import inspect
from hybridpar.errors import ConfigError
from hybridpar.state import state_of


def _batched(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self, distribute_strategy=None, *args, **kwargs):
        state = state_of(distribute_strategy)
        x = kwargs.get("x")
        if state is not None and isinstance(x, tf.data.Dataset) and not inspect.is_batched(x):
            if state.global_batch_size is None:
                raise ConfigError(
                    "The dataset given to Keras yields single examples and "
                    "data.global_batch_size is null, so hybridpar cannot batch it. Set "
                    "data.global_batch_size, or batch the dataset yourself."
                )
            kwargs["x"] = x.batch(state.global_batch_size)
        original(self, distribute_strategy, *args, **kwargs)

    return __init__


FIX = register(Fix(
    name="unbatched_input",
    corrects="Keras counts steps before the strategy sees the dataset, so unbatched input "
             "shows wrong progress",
    group="core",
    patches=(Patch(keras_tf_trainer.TFEpochIterator, "__init__", _batched),),
))

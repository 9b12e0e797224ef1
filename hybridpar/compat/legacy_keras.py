"""``tf.keras`` under ``TF_USE_LEGACY_KERAS=1`` fails with a message that says what happened.

Upstream (TensorFlow 2.21, ``KerasLazyLoader._initialize`` in
``tensorflow/python/util/lazy_loader.py``): with ``TF_USE_LEGACY_KERAS=1``
the first use of ``tf.keras`` imports the legacy ``tf_keras`` package
(Keras 2). Ray Train (2.60, ``_setup_tensorflow_environment`` in
``ray/train/tensorflow/config.py``) sets the variable on every worker. A
Keras 3 script (``import keras``) is not affected, but a ``tf.keras`` call
in it then either fails with "Keras cannot be imported. Check that it is
installed." (when tf_keras is missing; a second use recurses until
``RecursionError``) or builds a Keras 2 object that Keras 3 and hybridpar
cannot train.

While a strategy hybridpar built is alive and the variable is set:
inside that strategy's scope, ``tf.keras`` raises an ``ImportError`` that
names the variable, who sets it and both fixes, instead of loading Keras 2;
outside it, TensorFlow's own routing runs and only its ImportError gets
that message.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import tensorflow as tf
from tensorflow.python.util import lazy_loader

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import state_of

ENV = "TF_USE_LEGACY_KERAS"
_TRUE = ("true", "True", "1")  # what lazy_loader accepts


def legacy_keras_requested() -> bool:
    """True when ``TF_USE_LEGACY_KERAS`` routes ``tf.keras`` to tf_keras."""
    return os.environ.get(ENV) in _TRUE


def explanation() -> str:
    """What ``TF_USE_LEGACY_KERAS`` does to ``tf.keras`` here, and how to fix it."""
    installed = importlib.util.find_spec("tf_keras") is not None
    target = "tf_keras (Keras 2)" if installed else "tf_keras (Keras 2), which is not installed"
    return (
        f"tf.keras was used while {ENV}={os.environ.get(ENV)} is set (Ray Train's "
        f"TensorflowTrainer sets it on every worker), so TensorFlow routes tf.keras to {target}; "
        "hybridpar trains Keras 3 models. Use Keras 3 throughout: `import keras` and "
        "keras.layers / keras.Model / keras.optimizers instead of tf.keras.*. For code you "
        f"cannot change, set os.environ[{ENV!r}] = '0' before anything uses tf.keras (at the "
        "top of train_loop_per_worker)."
    )


def _explained(original: Any) -> Any:
    def initialize(self):
        if state_of(tf.distribute.get_strategy()) is not None:
            raise ImportError(explanation())
        try:
            return original(self)
        except ImportError as err:
            self._tfll_initialized = False  # the next use asks again instead of recursing
            raise ImportError(explanation()) from err

    return initialize


FIX = register(Fix(
    name="legacy_keras",
    corrects="with TF_USE_LEGACY_KERAS=1 (set by Ray Train) tf.keras loads Keras 2 or fails "
             "with 'Keras cannot be imported'",
    upstream="ray-project/ray#47464",
    group="core",
    patches=(Patch(lazy_loader.KerasLazyLoader, "_initialize", _explained,
                     owns=lambda *args, **kwargs: legacy_keras_requested()),),
))

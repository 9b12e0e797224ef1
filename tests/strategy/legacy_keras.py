"""hybridpar under TF_USE_LEGACY_KERAS=1 (as Ray Train sets it), in a fresh process.

    python legacy_keras.py [installed]

Prints one JSON line: whether a Keras 3 model trains in a hybridpar scope, and
what ``tf.keras`` raises inside the scope and outside it (twice) while the
strategy is alive: with tf_keras hidden as if it were not installed, or with
``installed``, with the tf_keras the test extra installs.
tests/strategy/test_compat_upstream.py reads it.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import keras
import numpy as np
import tensorflow as tf

import hybridpar

if sys.argv[1:] != ["installed"]:
    sys.modules["tf_keras"] = None  # as without tf_keras (the test extra installs it)


def attempt(build) -> str:
    try:
        build()
        return "ok"
    except (ImportError, RecursionError) as err:
        return f"{type(err).__name__}: {err}"


x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
with hybridpar.scope({"data_parallel": {"mode": "none"}}) as hs:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    inside = attempt(lambda: tf.keras.layers.Dense(1))
history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
outside = [attempt(lambda: tf.keras.layers.Dense(1)) for _ in range(2)]
print(json.dumps({"trained": len(history.history["loss"]) == 1, "inside": inside,
                  "outside": outside, "mode": hs.mode}), flush=True)

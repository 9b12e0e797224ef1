"""A Keras 3 model built outside a MirroredStrategy's scope, WITHOUT hybridpar (run as a script).

Prints one JSON line. tests/strategy/test_compat_model_scope.py runs it in a
fresh process (no hybridpar fix installed): Keras 3 compiles such a model
inside the scope without a word, then ``fit`` fails with a bare
AssertionError, as it does for one compiled outside and fit inside the block;
an Adam optimizer made outside fails with "Mixing different
tf.distribute.Strategy objects".

    python upstream_scope_order.py
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)


def model() -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def outcome(call) -> str:
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return "ok"


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
compiled_inside, compiled_outside = model(), model()
compiled_outside.compile("sgd", "mse")
with strategy.scope():
    compiled = outcome(lambda: compiled_inside.compile("sgd", "mse"))
    trained_inside = outcome(lambda: compiled_outside.fit(x, y, batch_size=8, verbose=0))
trained_after = outcome(lambda: compiled_inside.fit(x, y, batch_size=8, verbose=0))
optimizer = keras.optimizers.Adam()
with strategy.scope():
    inside = model()
    inside.compile(optimizer, "mse")
optimizer_outside = outcome(lambda: inside.fit(x, y, batch_size=8, verbose=0))
print(json.dumps({
    "compile_inside": compiled,
    "fit_after": trained_after,
    "fit_inside": trained_inside,
    "kernel": type(compiled_outside.layers[0].kernel.value).__name__,
    "optimizer_outside": optimizer_outside,
}))

"""A plain Keras `model.fit` under MultiWorkerMirroredStrategy, WITHOUT hybridpar.

Upstream Keras 3.15 fails here (keras-team/keras#20585, tensorflow/tensorflow#72388):
first where it reduces a nested PerReplica batch to learn input shapes, and,
with that step skipped (argv[1] == "built": the model is built up front and
Keras's shape-learning step is switched off), where it reduces scalar
metrics with axis=0.
"""

import sys

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
features = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, features[:, :1])).batch(16)
with strategy.scope():
    inputs = keras.Input((4,), name="x")
    model = keras.Model({"x": inputs}, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse", metrics=["mae"])
    if sys.argv[1:] == ["built"]:
        model.build({"x": (None, 4)})
        model.optimizer.build(model.trainable_variables)
        model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
model.fit(dataset, epochs=1, verbose=0)

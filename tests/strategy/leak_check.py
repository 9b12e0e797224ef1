"""Trains plain Keras models in a fresh process, after hybridpar was used or never imported.

    python leak_check.py {plain|after_hybridpar} OUT.npz

``after_hybridpar`` first builds, trains and leaves a hybridpar scope with
``model_parallel.stages: 2`` and keeps it alive, so every fix it needs stays
installed. Then both modes train the same two models and save their weights:
a hand-built ``tf.distribute.MirroredStrategy`` on a file-backed dataset with
a partial last batch (a batch-norm model; its evaluate and predict figures too),
and a model with an ``Embedding`` outside any strategy.
tests/strategy/test_compat_scoping.py checks they are equal bit for bit.
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
import upstream_keras  # beside this file

MODE, OUT = sys.argv[1], sys.argv[2]
if MODE == "after_hybridpar":
    import hybridpar

    hybridpar.testing.use_logical_cpus(4)
else:
    upstream_keras.logical_cpus(4)

kept = []
if MODE == "after_hybridpar":
    config = {"data_parallel": {"mode": "mirrored"},
              "model_parallel": {"stages": 2, "placement": {"^second$": 1}},
              "data": {"global_batch_size": 16}}
    with hybridpar.scope(config) as hs:
        staged = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
                                   keras.layers.Dense(1, name="second")])
        staged.compile("adam", "mse")
    staged.fit(upstream_keras.FEATURES, upstream_keras.TARGETS, batch_size=16, epochs=1,
               verbose=0)
    kept.append((hs, staged))

keras.utils.set_random_seed(1)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with tempfile.TemporaryDirectory() as directory:
    dataset = upstream_keras.file_dataset(directory)
    with strategy.scope():
        mirrored = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                     keras.layers.BatchNormalization(),
                                     keras.layers.Dense(1)])
        mirrored.compile(keras.optimizers.Adam(0.05), "mse")
    mirrored.fit(dataset, epochs=2, verbose=0)
    figures = mirrored.evaluate(dataset, verbose=0)
    predicted = mirrored.predict(dataset.map(lambda x, y: x), verbose=0)

keras.utils.set_random_seed(2)
ids = np.random.default_rng(0).integers(0, 50, size=(64, 3))
labels = np.random.default_rng(1).normal(size=(64, 1)).astype("float32")
embedded = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                             keras.layers.Flatten(), keras.layers.Dense(1)])
embedded.compile(keras.optimizers.Adam(0.05), "mse")
embedded.fit(ids, labels, batch_size=24, epochs=2, verbose=0)
eager = embedded(ids[:5]).numpy()

arrays = {f"mirrored_{i}": w for i, w in enumerate(mirrored.get_weights())}
arrays |= {f"embedded_{i}": w for i, w in enumerate(embedded.get_weights())}
np.savez(OUT, eager=eager, figures=figures, predicted=predicted, **arrays)

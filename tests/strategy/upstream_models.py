"""Reproduces the upstream behaviours behind real models' failures, WITHOUT hybridpar.

Run as a script in a fresh process (tests/strategy/test_compat_upstream_models.py):
one JSON line with every measurement, so the TensorFlow start-up is paid once.

    python upstream_models.py all
"""

import gc
import json
import os
import sys
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from upstream_keras import logical_cpus  # beside this file

RNG = np.random.default_rng(0)
X = RNG.normal(size=(70, 8)).astype("float32")
Y = RNG.integers(0, 3, 70)


def mlp(batch_norm: bool, synchronized: bool = False) -> keras.Model:
    layers = [keras.Input((8,)), keras.layers.Dense(16)]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(synchronized=synchronized))
    return keras.Sequential([*layers, keras.layers.Dense(3)])


def compiled(strategy: tf.distribute.Strategy, **kwargs) -> keras.Model:
    with strategy.scope():
        model = mlp(**kwargs)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def last_split(strategy: tf.distribute.Strategy, examples: int) -> list[int]:
    """Per-replica sizes of the final batch of ``examples`` in batches of 32."""
    dataset = tf.data.Dataset.from_tensor_slices(X[:examples]).batch(32)
    last = list(strategy.experimental_distribute_dataset(dataset))[-1]
    return [int(v.shape[0]) for v in strategy.experimental_local_results(last)]


def nan_rows(strategy: tf.distribute.Strategy) -> int:
    """Rows ``predict`` returns as NaN after one epoch of a batch-norm MLP whose final batch
    of 2 examples leaves two of four replicas empty."""
    model = compiled(strategy, batch_norm=True)
    model.fit(X[:66], Y[:66], batch_size=32, epochs=1, verbose=0)
    return int(np.isnan(model.predict(X[:66], batch_size=32, verbose=0)).any(axis=1).sum())


def copy_spread(strategy: tf.distribute.Strategy) -> float:
    """How far the copies of the moving statistics drift in one epoch of even batches."""
    model = compiled(strategy, batch_norm=True)
    model.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0, shuffle=False)
    spread = 0.0
    for variable in model.non_trainable_variables:
        copies = [c.numpy() for c in variable.value.values]
        spread = max(spread, *(float(np.max(np.abs(c - copies[0]))) for c in copies))
    return spread


def synchronized_keeps_strategy_alive(strategies: list) -> bool:
    """Whether the last strategy of ``strategies`` (taken from the list) outlives a fit of a
    synchronized batch-norm model once nothing refers to it."""
    model = compiled(strategies[-1], batch_norm=True, synchronized=True)
    model.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0)
    alive = weakref.ref(strategies.pop())
    del model
    gc.collect()
    return alive() is not None


def metrics_ignore_sample_weight() -> dict:
    """Accuracy of a model that gets every row wrong, with weight 1 on one row and 0 on the
    others, as a compiled ``metrics`` and as a ``weighted_metrics`` entry."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, kernel_initializer="zeros",
                                                                   bias_initializer="zeros")])
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  weighted_metrics=["accuracy"])
    x, y = np.zeros((4, 1), "float32"), np.array([1, 0, 0, 0])  # argmax of zeros is class 0
    figures = model.evaluate(x, y, sample_weight=np.array([1.0, 0, 0, 0]), verbose=0,
                             return_dict=True)
    return {name: round(float(value), 4) for name, value in figures.items() if "acc" in name}


def measure_all() -> dict:
    logical_cpus(4)
    strategy = tf.distribute.MirroredStrategy()  # one per process: a second one's
    found = {                                    # collective keys collide with it
        "last_split_66": last_split(strategy, 66),
        "last_split_70": last_split(strategy, 70),
        "nan_rows": nan_rows(strategy),
        "copy_spread": copy_spread(strategy),
        "accuracy": metrics_ignore_sample_weight(),
    }
    strategies = [strategy]
    del strategy
    return {**found, "synchronized_alive": synchronized_keeps_strategy_alive(strategies)}


if __name__ == "__main__":
    assert sys.argv[1] == "all"
    print(json.dumps(measure_all()), flush=True)

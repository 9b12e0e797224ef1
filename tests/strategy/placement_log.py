"""Trains a 2 x 2 hybrid model for one step with TensorFlow's placement log on.

Run as a script by test_placement.py with TF_CPP_MIN_LOG_LEVEL=0: TensorFlow
logs device placement only when it is switched on before its runtime starts,
so this needs a fresh process. The placer's lines go to stderr.
"""

import keras
import numpy as np
import tensorflow as tf

import hybridpar


def main() -> None:
    tf.debugging.set_log_device_placement(True)
    hybridpar.testing.use_logical_cpus(4)
    config = {
        "data_parallel": {"mode": "mirrored"},
        "model_parallel": {"stages": 2, "placement": {"^mid$": 1, "^head$": 1}},
    }
    with hybridpar.scope(config):
        inputs = keras.Input((8,))
        x = keras.layers.Dense(16, activation="relu", name="body")(inputs)
        x = keras.layers.Dense(16, activation="relu", name="mid")(x)
        model = keras.Model(inputs, keras.layers.Dense(3, name="head")(x))
        model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 8), "float32"), np.ones((8, 3), "float32"), batch_size=8, verbose=0)


if __name__ == "__main__":
    main()

"""Small classifiers for the embedded ``hybridpar_digits`` data (8x8 grey images)."""

from __future__ import annotations

import keras


def digits_mlp(num_classes: int = 10, input_shape: tuple[int, ...] = (8, 8, 1)) -> keras.Model:
    """A two-layer perceptron: the quick-start model."""
    return keras.Sequential(
        [
            keras.Input(input_shape, name="image"),
            keras.layers.Rescaling(1.0 / 255, name="rescale"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(128, activation="relu", name="hidden"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="digits_mlp",
    )


def digits_cnn(num_classes: int = 10, input_shape: tuple[int, ...] = (8, 8, 1)) -> keras.Model:
    """A small convolutional network (functional API)."""
    image = keras.Input(input_shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255, name="rescale")(image)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(x)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(64, activation="relu", name="hidden")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(image, logits, name="digits_cnn")

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


@keras.saving.register_keras_serializable(package="hybridpar_models")
class TransformerBlock(keras.layers.Layer):
    """Pre-norm self-attention + MLP block; its sublayers follow it onto a stage."""

    def __init__(self, dim: int = 32, heads: int = 4, mlp_dim: int = 64, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dim, self.heads, self.mlp_dim = dim, heads, mlp_dim
        self.attention_norm = keras.layers.LayerNormalization(name="attention_norm")
        self.attention = keras.layers.MultiHeadAttention(heads, dim // heads, name="attention")
        self.mlp_norm = keras.layers.LayerNormalization(name="mlp_norm")
        self.mlp_in = keras.layers.Dense(mlp_dim, activation="gelu", name="mlp_in")
        self.mlp_out = keras.layers.Dense(dim, name="mlp_out")

    def build(self, input_shape):
        self.attention_norm.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.mlp_norm.build(input_shape)
        self.mlp_in.build(input_shape)
        self.mlp_out.build((*input_shape[:-1], self.mlp_dim))

    def call(self, x):
        normed = self.attention_norm(x)
        x = x + self.attention(normed, normed)
        return x + self.mlp_out(self.mlp_in(self.mlp_norm(x)))

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "heads": self.heads,
                "mlp_dim": self.mlp_dim}


def digits_transformer(
    num_classes: int = 10,
    input_shape: tuple[int, ...] = (8, 8, 1),
    blocks: int = 4,
    dim: int = 32,
) -> keras.Model:
    """A small transformer over the image's rows (8 tokens of 8 pixels).

    Its layers are named for placement rules: ``embed``, ``block_0`` ..
    ``block_<blocks-1>`` and ``head`` (``configs/hybrid_2x2.yaml`` splits the
    blocks over two stages).
    """
    image = keras.Input(input_shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255, name="rescale")(image)
    x = keras.layers.Reshape((input_shape[0], -1), name="rows")(x)
    x = keras.layers.Dense(dim, name="embed")(x)
    for index in range(blocks):
        x = TransformerBlock(dim, name=f"block_{index}")(x)
    x = keras.layers.LayerNormalization(name="head_norm")(x)
    x = keras.layers.GlobalAveragePooling1D(name="head_pool")(x)
    logits = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(image, logits, name="digits_transformer")

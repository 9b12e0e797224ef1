"""What the equivalence, checkpoint and model-zoo tests share: weights, mirrored copies,
twins, and a crash at a given step.

Imported by test modules as ``import model_checks`` (this folder is on the test path,
like ``launch_helpers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np


def max_weight_difference(left: list[np.ndarray], right: list[np.ndarray]) -> float:
    """The largest absolute difference between two models' weight lists."""
    assert len(left) == len(right), f"{len(left)} weights against {len(right)}"
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(left, right, strict=True))


def copy_spread(model: keras.Model) -> float:
    """The largest difference between the per-device copies of any of ``model``'s variables
    (0.0 when every mirrored variable holds one value)."""
    spread = 0.0
    for variable in model.variables:
        copies = getattr(variable.value, "values", None)
        if not copies or len(copies) < 2:
            continue
        first = np.asarray(copies[0].numpy(), dtype=np.float64)
        spread = max(spread, *(float(np.max(np.abs(np.asarray(c.numpy(), np.float64) - first),
                                            initial=0.0)) for c in copies[1:]))
    return spread


def batch_norm_statistics_finite(model: keras.Model) -> bool:
    """True when every batch-norm moving mean and variance of ``model`` is finite."""
    statistics = [
        v for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization)
        for v in (layer.moving_mean, layer.moving_variance)
    ]
    assert statistics, "the model has no batch-norm layer"
    return all(np.isfinite(np.asarray(v)).all() for v in statistics)


def single_device_twin(build: Callable[[], keras.Model], model: keras.Model,
                       compile_kwargs: dict[str, Any] | None = None) -> keras.Model:
    """A model built by ``build`` outside any strategy, holding ``model``'s weights."""
    twin = build()
    twin.set_weights(model.get_weights())
    if compile_kwargs is not None:
        twin.compile(**compile_kwargs)
    return twin


def assert_outputs_close(actual: Any, expected: Any, atol: float) -> None:
    """Every array of two (nested) prediction outputs agrees within ``atol``, same shapes."""
    actual_flat, expected_flat = keras.tree.flatten(actual), keras.tree.flatten(expected)
    assert len(actual_flat) == len(expected_flat)
    for a, e in zip(actual_flat, expected_flat, strict=True):
        assert np.shape(a) == np.shape(e), f"shape {np.shape(a)} against {np.shape(e)}"
        np.testing.assert_allclose(a, e, atol=atol, rtol=0)


MIXED_POLICIES = {"mixed_float16": 2.0**-11, "mixed_bfloat16": 2.0**-8}  # unit roundoffs
# One epoch of SGD under mixed precision: each replica's gradient is rounded to the
# compute dtype before the float32 all-reduce (one rounding per partial sum, where one
# device rounds the whole sum once), so the update differs from one device's by about one
# unit roundoff of the update: 1.2 to 1.8 measured on 4 mirrored CPUs and on a 2 x 2
# pipeline with microbatches. The bound leaves room for the rounding of the all-reduce.
MIXED_TOLERANCE_UNITS = 4.0


def mixed_precision_mlp() -> keras.Model:
    return keras.Sequential([keras.Input((16,)),
                             keras.layers.Dense(32, activation="relu", name="a"),
                             keras.layers.Dense(32, activation="relu", name="b"),
                             keras.layers.Dense(4, name="c")])


def mixed_precision_compile() -> dict[str, Any]:
    return {"optimizer": keras.optimizers.SGD(0.1),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def update_error(start: list, expected: list, actual: list) -> float:
    """The largest difference between two runs' weights after training from ``start``,
    relative to the expected run's largest update, over every weight."""
    return max(float(np.max(np.abs(a - e))) / float(np.max(np.abs(e - s)))
               for s, e, a in zip(start, expected, actual, strict=True))


def tiny_keras_hub(cls: str) -> keras.Model:
    """A keras_hub backbone ``cls`` built from a tiny config (no weights; skips without
    keras_hub)."""
    import pytest

    keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    return getattr(keras_hub.models, cls)(
        vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=8, dropout=0.0)


class DenseGradientAdam(keras.optimizers.Adam):
    """Adam given every gradient dense.

    Keras's TensorFlow backend applies an ``IndexedSlices`` gradient (an untied
    embedding's) part by part: a token that occurs twice in a batch adds the squares
    of its two parts to Adam's second moment, not the square of their sum. Sharded
    optimizer state (ZeRO) reduce-scatters dense gradients, so its one-device reference
    trains with this optimizer.
    """

    def apply(self, grads, trainable_variables=None):
        import tensorflow as tf

        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        return super().apply(dense, trainable_variables)


def causal_lm(cls: str, dense_gradients: bool = False, **sizes: Any) -> keras.Model:
    """A keras_hub backbone ``cls`` from a tiny config with its token embedding's reverse as
    the output layer (tied for GPT-2, untied for Llama), compiled with per-token
    cross-entropy and Adam (``DenseGradientAdam`` with ``dense_gradients``; skips without
    keras_hub)."""
    import pytest

    keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    heads = ({"num_query_heads": 4, "num_key_value_heads": 2} if cls == "LlamaBackbone"
             else {"num_heads": 4, "max_sequence_length": 8, "dropout": 0.0})
    backbone = getattr(keras_hub.models, cls)(
        **{"vocabulary_size": 64, "num_layers": 2, "hidden_dim": 16, "intermediate_dim": 32,
           **heads, **sizes})
    inputs = {"token_ids": keras.Input((8,), dtype="int32", name="token_ids"),
              "padding_mask": keras.Input((8,), dtype="bool", name="padding_mask")}
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    model = keras.Model(inputs, logits)
    optimizer = DenseGradientAdam if dense_gradients else keras.optimizers.Adam
    model.compile(optimizer=optimizer(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit_causal_lm(config: dict, cls: str, examples: int = 36, epochs: int = 2,
                  callbacks: Callable[[Any], list] | None = None,
                  dense_gradients: bool = False) -> tuple[keras.Model, list]:
    """``causal_lm(cls, dense_gradients)`` built in ``hybridpar.scope(config)`` (seed 5) and
    fit on ``examples`` token sequences (batch 8, vocabulary 64; callbacks from
    ``callbacks(hs)``).

    Returns:
        The model and its per-epoch losses.
    """
    import hybridpar

    keras.utils.set_random_seed(5)
    with hybridpar.scope(config) as hs:
        model = causal_lm(cls, dense_gradients)
        extra = callbacks(hs) if callbacks is not None else []
    x, ids = token_batch(examples, vocabulary=64)
    history = model.fit(x, np.roll(ids, -1, axis=1), batch_size=8, epochs=epochs,
                        shuffle=False, verbose=0, callbacks=extra)
    return model, history.history["loss"]


def token_batch(examples: int, vocabulary: int = 50, length: int = 8) -> tuple[dict, np.ndarray]:
    """``examples`` random token sequences as keras_hub inputs, and the token ids."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocabulary, (examples, length)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}, ids



class Crash(keras.callbacks.Callback):
    """Stops the process's training abruptly after optimizer step ``at`` (a simulated crash:
    ``KeyboardInterrupt`` escapes ``fit``, as a kill would end it)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.at:
            raise KeyboardInterrupt(f"crash after step {self.at}")

"""Losses of every rank fed by ``tf.data`` with a partial last batch, under every mode.

66 examples in batches of 16 leave a final batch of 2: over 4 replicas two of them get a
piece of padding. The padding must weigh 0 whatever the rank of the loss (per example
``[B]``, per token ``[B, T]``, per pixel ``[B, H, W]``) and of the user's own sample
weights (temporal ``[B, T]``). Keras cannot broadcast a ``[B]`` weight against a
``[B, T]`` loss (``squeeze_or_expand_to_same_rank``), so a padding weight of shape
``[B]`` made every sequence and dense-prediction model fail with ``Incompatible
shapes: [4,16] vs. [4]``. Runs on the 4 logical CPU devices of the test session.
"""

from collections.abc import Callable
from typing import Any

import keras
import model_checks
import numpy as np
import pytest
import tensorflow as tf

import hybridpar

pytestmark = pytest.mark.strategy

EXAMPLES, BATCH, LENGTH, VOCABULARY = 66, 16, 6, 20
RNG = np.random.default_rng(0)
TOKENS = RNG.integers(1, VOCABULARY, (EXAMPLES, LENGTH)).astype("int32")
TAGS = RNG.integers(0, VOCABULARY, (EXAMPLES, LENGTH))
LABELS = RNG.integers(0, 3, EXAMPLES)
TEMPORAL = RNG.uniform(0.0, 2.0, (EXAMPLES, LENGTH)).astype("float32")
IMAGES = RNG.normal(size=(EXAMPLES, 6, 6, 2)).astype("float32")
MASKS = RNG.integers(0, 3, (EXAMPLES, 6, 6))
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

SINGLE = {"data_parallel": {"mode": "none"}}
MIRRORED = {"data_parallel": {"mode": "mirrored"}}
ZERO = {"data_parallel": {"mode": "mirrored", "shard_optimizer_state": True}}
HYBRID = {"data_parallel": {"mode": "mirrored"},
          "model_parallel": {"stages": 2, "placement": {"^out": 1}, "microbatches": 2}}
ONE_F_ONE_B = {"data_parallel": {"mode": "mirrored"},
               "model_parallel": {"stages": 2, "placement": {"^out": 1}, "microbatches": 2,
                                  "schedule": "1f1b"}}


def tagger() -> keras.Model:
    """A per-token classifier: its loss is ``[B, T]``."""
    return keras.Sequential([keras.Input((LENGTH,), dtype="int32"),
                             keras.layers.Embedding(VOCABULARY, 8, name="embedding"),
                             keras.layers.Dense(16, activation="tanh", name="hidden"),
                             keras.layers.Dense(VOCABULARY, name="out")])


def segmenter() -> keras.Model:
    """A per-pixel classifier: its loss is ``[B, H, W]``."""
    return keras.Sequential([keras.Input((6, 6, 2)),
                             keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                                                 name="conv"),
                             keras.layers.Conv2D(3, 1, name="out")])


def two_heads() -> keras.Model:
    """A per-example and a per-token head on one encoder."""
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
    hidden = keras.layers.Embedding(VOCABULARY, 8, name="embedding")(tokens)
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(hidden)
    label = keras.layers.Dense(3, name="out_label")(keras.layers.GlobalAveragePooling1D()(hidden))
    tags = keras.layers.Dense(VOCABULARY, name="out_tags")(hidden)
    return keras.Model(tokens, {"label": label, "tags": tags})


# name: (build, compile keywords, inputs, targets, sample weights)
CASES: dict[str, tuple[Callable[[], keras.Model], dict, Any, Any, Any]] = {
    "per-token": (tagger, {"loss": LOSS, "metrics": ["accuracy"]}, TOKENS, TAGS, None),
    "temporal-weights": (tagger, {"loss": LOSS, "weighted_metrics": ["accuracy"]},
                         TOKENS, TAGS, TEMPORAL),
    "per-pixel": (segmenter, {"loss": LOSS, "metrics": ["accuracy"]}, IMAGES, MASKS, None),
    "per-example-and-per-token": (
        two_heads, {"loss": {"label": LOSS, "tags": LOSS}, "loss_weights": {"label": 1.0,
                                                                           "tags": 0.5}},
        TOKENS, {"label": LABELS, "tags": TAGS}, None),
}


def dataset(x: Any, y: Any = None, weights: Any = None) -> tf.data.Dataset:
    """Batches of 16 without ``drop_remainder``: the batch dimension is dynamic."""
    parts = tuple(part for part in (x, y, weights) if part is not None)
    return tf.data.Dataset.from_tensor_slices(parts if len(parts) > 1 else x).batch(BATCH)


def fit(config: dict, case: str, optimizer: Callable[[], Any] = lambda: keras.optimizers.Adam(
        0.01)) -> keras.Model:
    """Two epochs of ``optimizer`` (Adam) on the case's data, fed by ``tf.data``."""
    build, compile_keywords, x, y, weights = CASES[case]
    keras.utils.set_random_seed(5)
    with hybridpar.scope(config):
        model = build()
        model.compile(optimizer=optimizer(), **compile_keywords)
    model.fit(dataset(x, y, weights), epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 10  # 4 full batches and one of 2
    return model


def assert_like(model: keras.Model, single: keras.Model, case: str) -> None:
    """Weights, evaluate figures and predictions equal one device's within 1e-5."""
    _, _, x, y, weights = CASES[case]
    difference = model_checks.max_weight_difference(single.get_weights(), model.get_weights())
    assert difference <= 1e-5, f"{case}: max abs weight difference {difference:.3g}"
    figures = model.evaluate(dataset(x, y, weights), verbose=0, return_dict=True)
    expected = single.evaluate(dataset(x, y, weights), verbose=0, return_dict=True)
    assert figures.keys() == expected.keys()
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, abs=1e-5), f"{case}: {name}"
    predicted = model.predict(dataset(x), verbose=0)
    model_checks.assert_outputs_close(predicted, single.predict(dataset(x), verbose=0),
                                      atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_mirrored_trains_every_loss_rank_like_one_device(case):
    assert_like(fit(MIRRORED, case), fit(SINGLE, case), case)


@pytest.mark.slow
@pytest.mark.parametrize("config", [HYBRID, ONE_F_ONE_B], ids=["2x2-microbatches", "2x2-1f1b"])
@pytest.mark.parametrize("case", ["temporal-weights", "per-example-and-per-token"])
def test_pipelines_train_sequence_losses_like_one_device(config, case):
    assert_like(fit(config, case), fit(SINGLE, case), case)


def momentum() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.1, momentum=0.9)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["temporal-weights", "per-example-and-per-token"])
def test_sharded_optimizer_state_trains_sequence_losses_like_one_device(case):
    """SGD with momentum: its update is linear in the gradient, so an embedding's sparse
    gradient and the dense one sharding reduce-scatters give the same step (Adam's do not:
    ``test_sharded_adam_trains_an_embedding_on_its_dense_gradient``)."""
    assert_like(fit(ZERO, case, momentum), fit(SINGLE, case, momentum), case)


def one_hot_tagger() -> keras.Model:
    """``tagger`` with its embedding as a bias-free Dense on one-hot tokens: the same
    weights, a dense gradient."""
    tokens = keras.Input((LENGTH,), dtype="int32")
    one_hot = keras.layers.Lambda(lambda t: keras.ops.one_hot(t, VOCABULARY))(tokens)
    hidden = keras.layers.Dense(8, use_bias=False, name="embedding")(one_hot)
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(hidden)
    return keras.Model(tokens, keras.layers.Dense(VOCABULARY, name="out")(hidden))


@pytest.mark.slow
def test_sharded_adam_trains_an_embedding_on_its_dense_gradient():
    """Keras 3.15's Adam squares each row of an embedding's ``IndexedSlices`` gradient
    (``ops.square``), so a token seen twice in a step adds ``g1² + g2²`` to the second
    moment; sharding sums the gradient densely first, ``(g1 + g2)²``, as Keras 2's
    deduplicating Adam did. Sharded training equals one device's on the dense gradient."""
    sharded = fit(ZERO, "per-token")
    keras.utils.set_random_seed(5)
    dense = one_hot_tagger()
    dense.set_weights(fit(SINGLE, "per-token", lambda: keras.optimizers.Adam(0.0)).get_weights())
    dense.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS)
    dense.fit(dataset(TOKENS, TAGS), epochs=2, verbose=0)
    difference = model_checks.max_weight_difference(dense.get_weights(), sharded.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"
    sparse = fit(SINGLE, "per-token")
    assert model_checks.max_weight_difference(sparse.get_weights(), sharded.get_weights()) > 1e-3


@pytest.mark.slow
def test_a_compressed_all_reduce_trains_a_per_token_loss():
    """fp16 on the wire rounds each gradient, so the weights are close, not equal."""
    single = fit(SINGLE, "per-token")
    compressed = fit({**MIRRORED, "communication": {"compression": "fp16"}}, "per-token")
    difference = model_checks.max_weight_difference(single.get_weights(),
                                                    compressed.get_weights())
    assert difference <= 1e-2, f"max abs weight difference {difference:.3g}"


def test_the_issue_reproduction_trains_under_mirrored():
    """The report's script: a per-token loss fed by ``Dataset.batch(16)`` over 4 replicas."""
    rng = np.random.RandomState(0)
    x, y = rng.randint(1, 50, (128, 16)), rng.randint(0, 50, (128, 16))
    with hybridpar.scope(MIRRORED):
        model = keras.Sequential([keras.Input((16,), dtype="int32"),
                                  keras.layers.Embedding(50, 8), keras.layers.Dense(50)])
        model.compile("adam", LOSS)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == 8

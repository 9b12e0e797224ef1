"""Balanced per-replica batches, padding of weight zero, and batch norm's moving statistics.

A final batch of 66 examples in batches of 32 is 2 examples: over 4 replicas it is
padded to 1, 1, 1, 1 with two copies of weight zero; 70 examples leave 6, split 2, 2,
1, 1. Runs on the 4 logical CPU devices of the test session (tests/conftest.py).
"""

import keras
import model_checks
import numpy as np
import pytest
import tensorflow as tf

import hybridpar
from hybridpar.data import balanced

pytestmark = pytest.mark.strategy

MIRRORED = {"data_parallel": {"mode": "mirrored"}}
RNG = np.random.default_rng(0)
X = RNG.normal(size=(70, 8)).astype("float32")
Y = RNG.integers(0, 3, 70)
WEIGHTS = RNG.uniform(0.5, 2.0, 70).astype("float32")


def piece_rows(dataset: tf.data.Dataset, pieces: int, first: int = 0, count=None):
    return [(int(tf.shape(p.data[0])[0]), p.keep.numpy().tolist())
            for p in balanced.split_batches(dataset, pieces, first, count)]


def test_pieces_differ_by_at_most_one_and_padding_has_keep_zero():
    batches = tf.data.Dataset.from_tensor_slices((X[:66], Y[:66])).batch(30)  # 30, 30, 6
    rows = piece_rows(batches, 4)
    assert [size for size, _ in rows] == [8, 8, 7, 7, 8, 8, 7, 7, 2, 2, 1, 1]
    assert all(keep == [1.0] * size for size, keep in rows)
    tiny = tf.data.Dataset.from_tensor_slices((X[:2], Y[:2])).batch(32)
    assert piece_rows(tiny, 4) == [(1, [1.0]), (1, [1.0]), (1, [0.0]), (1, [0.0])]
    padding = [p.data[0].numpy() for p in balanced.split_batches(tiny, 4)]
    np.testing.assert_array_equal(padding[2], X[:1])  # padding copies the first example


def test_a_worker_takes_its_own_pieces_of_every_batch():
    batches = tf.data.Dataset.from_tensor_slices((X[:66], Y[:66])).batch(32)
    assert piece_rows(batches, 4, first=2, count=2) == [
        (8, [1.0] * 8), (8, [1.0] * 8), (8, [1.0] * 8), (8, [1.0] * 8), (1, [0.0]), (1, [0.0])
    ]


def test_every_replica_gets_a_balanced_non_empty_piece():
    with hybridpar.scope(MIRRORED) as hs:
        dataset = tf.data.Dataset.from_tensor_slices((X[:66], Y[:66])).batch(32)
        sizes = []
        for piece in hs.strategy.experimental_distribute_dataset(dataset):
            local = hs.strategy.experimental_local_results(piece.keep)
            sizes.append([(int(k.shape[0]), int(np.sum(k))) for k in local])
    assert sizes[-1] == [(1, 1), (1, 1), (1, 0), (1, 0)]
    assert sizes[0] == [(8, 8)] * 4


def mlp(batch_norm: bool = False) -> keras.Model:
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    return keras.Sequential([*layers, keras.layers.Dense(3, name="dense_out")])


COMPILE = {
    "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    "metrics": ["accuracy"],
    "weighted_metrics": ["accuracy"],
}


def fit(config: dict, examples: int, source: str, build=mlp, epochs: int = 2) -> keras.Model:
    """SGD with momentum on ``examples`` examples in batches of 32, sample-weighted."""
    keras.utils.set_random_seed(3)
    x, y, w = X[:examples], Y[:examples], WEIGHTS[:examples]
    with hybridpar.scope(config):
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), **COMPILE)
    if source == "numpy":
        model.fit(x, y, sample_weight=w, batch_size=32, epochs=epochs, shuffle=False, verbose=0)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(32)
        model.fit(dataset, epochs=epochs, verbose=0)
    return model


HYBRID = {"data_parallel": {"mode": "mirrored"},
          "model_parallel": {"stages": 2, "placement": {"^dense_out$": 1}, "microbatches": 2}}


@pytest.mark.slow
@pytest.mark.parametrize("config, examples, source", [
    (MIRRORED, 66, "numpy"), (MIRRORED, 70, "tf.data"), (HYBRID, 66, "tf.data")],
    ids=["mirrored-66-numpy-padded", "mirrored-70-tfdata-uneven", "2x2-microbatches-66"])
def test_partial_batches_train_evaluate_and_predict_like_one_device(config, examples, source):
    single = fit({"data_parallel": {"mode": "none"}}, examples, source)
    mirrored = fit(config, examples, source)
    difference = model_checks.max_weight_difference(single.get_weights(),
                                                    mirrored.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"
    x, y = X[:examples], Y[:examples]
    predicted = mirrored.predict(x, batch_size=32, verbose=0)
    assert predicted.shape == (examples, 3)  # exactly the input's rows, in order
    model_checks.assert_outputs_close(predicted, single.predict(x, batch_size=32, verbose=0),
                                      atol=1e-5)
    figures = mirrored.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    expected = single.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, abs=1e-5), name


@pytest.mark.slow
def test_batch_norm_copies_stay_equal_and_predict_matches_the_weights_on_one_device():
    model = fit(MIRRORED, 66, "numpy", build=lambda: mlp(batch_norm=True))
    assert model_checks.batch_norm_statistics_finite(model)
    assert model_checks.copy_spread(model) == 0.0
    twin = model_checks.single_device_twin(lambda: mlp(batch_norm=True), model, COMPILE)
    predicted = model.predict(X[:66], batch_size=32, verbose=0)
    assert np.isfinite(predicted).all()
    model_checks.assert_outputs_close(predicted, twin.predict(X[:66], verbose=0), atol=1e-5)


class OwnStep(keras.Model):
    """A subclassed model whose ``train_step`` unpacks ``(x, y)`` itself, as Keras's guide
    writes it; padding must still add nothing to its gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        return {"loss": loss}


def fit_own_step(config: dict) -> keras.Model:
    keras.utils.set_random_seed(3)
    with hybridpar.scope(config):
        model = OwnStep()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=COMPILE["loss"])
    model.fit(X[:66], Y[:66], batch_size=32, epochs=2, shuffle=False, verbose=0)
    return model


@pytest.mark.slow
def test_a_train_step_of_its_own_gives_padding_no_weight():
    single = fit_own_step({"data_parallel": {"mode": "none"}})
    mirrored = fit_own_step(MIRRORED)
    difference = model_checks.max_weight_difference(single.get_weights(),
                                                    mirrored.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


@pytest.mark.slow
def test_microbatches_of_a_padded_piece_are_padded_too():
    """4 replicas x 2 microbatches: each replica's final piece holds 1 example or padding,
    split over 2 microbatches."""
    single = fit({"data_parallel": {"mode": "none"}}, 66, "numpy")
    accumulated = fit({**MIRRORED, "model_parallel": {"microbatches": 2}}, 66, "numpy")
    difference = model_checks.max_weight_difference(single.get_weights(),
                                                    accumulated.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


@pytest.mark.parametrize("examples", [64, 66], ids=["static-8-per-replica", "varying"])
def test_an_input_with_a_fixed_batch_size_is_refused_before_the_first_step(examples):
    with hybridpar.scope(MIRRORED):
        model = keras.Sequential([keras.Input((8,), batch_size=32), keras.layers.Dense(3)])
        model.compile("sgd", COMPILE["loss"])
    gets = "8 examples" if examples == 64 else "a varying number of examples"
    with pytest.raises(hybridpar.ConfigError, match=(
            r"input 'input_layer.*' has a fixed batch size of 32 \(keras.Input\(shape=\(8,\), "
            rf"batch_size=32\)\), but under data_parallel.mode='mirrored' each of the 4 "
            rf"replicas gets .*{gets}.*Build the input without a batch size")):
        model.fit(X[:examples], Y[:examples], batch_size=32, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_an_empty_piece_becomes_one_zero_example_of_weight_zero():
    empty = balanced.ReplicaBatch(
        (tf.zeros([0, 3]), tf.constant([], tf.string),
         tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))),
        tf.zeros([0]))
    features, names, ragged = balanced.zero_row_if_empty(empty).data
    assert balanced.zero_row_if_empty(empty).keep.numpy().tolist() == [0.0]
    assert features.numpy().tolist() == [[0.0, 0.0, 0.0]]
    assert names.numpy().tolist() == [b""]
    assert ragged.to_list() == [[]]
    full = balanced.ReplicaBatch((tf.ones([2, 3]),), tf.ones([2]))
    assert balanced.zero_row_if_empty(full).data[0].numpy().tolist() == [[1.0] * 3] * 2

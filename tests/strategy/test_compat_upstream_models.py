"""The upstream behaviours real models meet (upstream_models.py, a fresh process without
hybridpar), then hybridpar's fixes of them: even_batches, moving_statistics,
padded_steps, sync_batch_norm.

If an upstream assertion starts failing, upstream changed and the fix should be
revisited.
"""

import pathlib

import keras
import model_checks
import numpy as np
import pytest
from upstream_runner import run_case  # beside this file

import hybridpar

pytestmark = pytest.mark.strategy

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8, 8, 3)).astype("float32")
Y = RNG.integers(0, 4, 64)


@pytest.fixture(scope="module")
def upstream() -> dict:
    return run_case(pathlib.Path(__file__).with_name("upstream_models.py"), "all")


@pytest.mark.slow
def test_upstream_final_batches_leave_replicas_empty(upstream):
    assert upstream["last_split_66"] == [1, 1, 0, 0]
    assert upstream["last_split_70"] == [2, 2, 2, 0]


@pytest.mark.slow
def test_upstream_empty_replicas_make_batch_norm_nan_everywhere(upstream):
    assert upstream["nan_rows"] == 66


@pytest.mark.slow
def test_upstream_batch_norm_copies_drift_apart(upstream):
    assert upstream["copy_spread"] > 1e-6


@pytest.mark.slow
def test_upstream_synchronized_batch_norm_keeps_its_strategy_alive(upstream):
    assert upstream["synchronized_alive"]


@pytest.mark.slow
def test_upstream_compiled_metrics_ignore_sample_weights(upstream):
    assert upstream["accuracy"] == {"accuracy": 0.75, "weighted_accuracy": 0.0}


def conv_bn(synchronized: bool) -> keras.Model:
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(8, 3),
        keras.layers.BatchNormalization(synchronized=synchronized),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(4),
    ])


def fit_conv_bn(mode: str, synchronized: bool) -> tuple[keras.Model, hybridpar.HybridStrategy]:
    keras.utils.set_random_seed(1)
    with hybridpar.scope({"data_parallel": {"mode": mode}}) as hs:
        model = conv_bn(synchronized)
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, Y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    return model, hs


@pytest.mark.slow
def test_synchronized_batch_norm_trains_like_one_device():
    """(That it keeps no strategy alive is checked in a fresh process: compat_lifecycle.py.)"""
    single, _ = fit_conv_bn("none", synchronized=True)
    mirrored, hs = fit_conv_bn("mirrored", synchronized=True)
    assert hs.num_replicas == 4  # 8 examples per replica: statistics over all 32
    difference = model_checks.max_weight_difference(single.get_weights(), mirrored.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"
    assert model_checks.copy_spread(mirrored) == 0.0


@pytest.mark.slow
def test_per_replica_batch_norm_keeps_its_copies_equal():
    model, _ = fit_conv_bn("mirrored", synchronized=False)
    assert model_checks.copy_spread(model) == 0.0
    twin = model_checks.single_device_twin(lambda: conv_bn(False), model)
    model_checks.assert_outputs_close(model.predict(X, verbose=0), twin.predict(X, verbose=0),
                                      atol=1e-5)

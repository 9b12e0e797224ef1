"""compat.model_scope: a model built outside hybridpar.scope(), upstream and with the fix.

Upstream is reproduced without hybridpar in a fresh process
(tests/strategy/upstream_scope_order.py). The parameter-server case (a model
stranded on /job:localhost) needs a cluster: tests/multiworker/test_script_orders.py.
"""

import pathlib

import keras
import numpy as np
import pytest
from upstream_runner import run_case  # beside this file

import hybridpar
from hybridpar.compat import model_scope, patching

pytestmark = pytest.mark.strategy

MIRRORED = {"data_parallel": {"mode": "mirrored", "devices": ["/cpu:0", "/cpu:1"]}}
X = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def model(name: str) -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="dense")], name=name)


@pytest.mark.slow
def test_upstream_keras_accepts_a_model_built_outside_the_scope_then_fails_in_fit():
    result = run_case(pathlib.Path(__file__).with_name("upstream_scope_order.py"), "")
    assert result["compile_inside"] == "ok"  # tf_keras refused it here
    assert result["fit_after"] == result["fit_inside"] == "AssertionError: "
    assert result["kernel"] == "ResourceVariable"
    assert result["optimizer_outside"].startswith(
        "RuntimeError: Mixing different tf.distribute.Strategy objects")


def test_compile_inside_the_scope_names_the_model_built_outside():
    outside = model("built_outside")
    with hybridpar.scope(MIRRORED), pytest.raises(
        hybridpar.ConfigError,
        match=r"Model 'built_outside' holds variables created outside hybridpar.scope\(\) "
              r"\(built_outside/dense/kernel, built_outside/dense/bias: plain variables on "
              r".*CPU:0\), so it cannot train under data_parallel.mode='mirrored' \(found at "
              r"model.compile\).*Build and compile the model, and any layer it reuses, inside",
    ):
        outside.compile("sgd", "mse")


def test_a_model_assembled_in_the_scope_from_a_base_built_outside_is_refused_at_compile():
    base = model("pretrained_base")
    with hybridpar.scope(MIRRORED):
        assembled = keras.Sequential([base, keras.layers.Dense(1)], name="assembled")
        with pytest.raises(hybridpar.ConfigError,
                           match=r"Model 'assembled' holds variables created outside "
                                 r"hybridpar.scope\(\) \(pretrained_base/dense/kernel, "
                                 r"pretrained_base/dense/bias:"):
            assembled.compile("sgd", "mse")


def test_fit_inside_the_scope_is_refused_and_evaluate_predict_give_one_device_figures():
    outside = model("compiled_outside")
    outside.compile("sgd", "mse")
    expected_loss, expected = outside.evaluate(X, Y, verbose=0), outside.predict(X, verbose=0)
    with hybridpar.scope(MIRRORED):
        with pytest.raises(hybridpar.ConfigError, match=r"\(found at model.fit\)"):
            outside.fit(X, Y, batch_size=8, verbose=0)
        assert outside.evaluate(X, Y, batch_size=8, verbose=0) == pytest.approx(
            expected_loss, abs=1e-6)
        np.testing.assert_allclose(outside.predict(X, batch_size=8, verbose=0), expected,
                                   atol=1e-6)
    assert outside.optimizer.iterations.numpy() == 0  # nothing trained


def test_an_optimizer_made_outside_the_scope_is_refused_at_compile():
    optimizer = keras.optimizers.Adam(name="adam_outside")
    with hybridpar.scope(MIRRORED), pytest.raises(
        hybridpar.ConfigError,
        match=r"The optimizer 'adam_outside' given to model.compile was created outside "
              r"hybridpar.scope\(\).*Create the optimizer inside the scope",
    ):
        model("inside").compile(optimizer, "mse")


def test_under_mode_none_a_model_built_outside_trains_and_plain_keras_is_untouched():
    outside, plain = model("outside_none"), model("plain")
    plain.compile("sgd", "mse")
    with hybridpar.scope({"data_parallel": {"mode": "none"}}):
        outside.compile("sgd", "mse")
        outside.fit(X, Y, batch_size=8, verbose=0)
    with hybridpar.scope(MIRRORED) as alive:  # a mirrored strategy, its fixes installed
        pass
    assert patching.is_installed(model_scope.FIX) and alive.mode == "mirrored"
    plain.fit(X, Y, batch_size=8, verbose=0)  # outside every scope: Keras's own path
    assert outside.optimizer.iterations.numpy() == plain.optimizer.iterations.numpy() == 4


def test_load_model_still_compiles_the_model_it_loads(tmp_path):
    """Keras compiles a loaded model only if its class's compile is Trainer.compile."""
    saved = model("saved")
    saved.compile("sgd", "mse")
    saved.save(tmp_path / "saved.keras")
    with hybridpar.scope(MIRRORED) as alive:
        pass
    assert patching.is_installed(model_scope.FIX) and alive.mode == "mirrored"
    loaded = keras.models.load_model(tmp_path / "saved.keras")
    assert loaded.compiled
    assert loaded.evaluate(X, Y, verbose=0) == pytest.approx(saved.evaluate(X, Y, verbose=0))

"""``model_parallel.placement: auto``: the cut, where the weights go, the report, bad input.

Runs on the 4 logical CPU devices of the test session (tests/conftest.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import max_weight_difference, single_device_twin

import hybridpar
from hybridpar import ConfigError

pytestmark = pytest.mark.strategy

X = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
Y = np.ones((16, 4), "float32")


def mlp(widths=(32, 32, 32)) -> keras.Model:
    layers = [keras.layers.Dense(w, name=f"d{i}") for i, w in enumerate(widths)]
    return keras.Sequential([keras.Input((8,)), *layers, keras.layers.Dense(4, name="out")])


def devices(variable) -> list[str]:
    value = variable.value
    parts = list(getattr(value, "values", [value]))
    return [tf.DeviceSpec.from_string(p.device).to_string().split("/device:")[-1] for p in parts]


def fit_in_scope(config: dict, build=mlp):
    with hybridpar.scope(config) as hs:
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return model, hs


def test_stages_without_placement_cut_the_model_and_move_weights_and_slots():
    model, hs = fit_in_scope({"data_parallel": {"mode": "mirrored"},
                              "model_parallel": {"stages": 2}})
    report = hs.describe(model)
    stages = {row.path: row.stage for row in report.layers}
    assert stages == {"d0": 0, "d1": 0, "d2": 1, "out": 1}
    assert {row.placed_by for row in report.layers} == {"auto"}
    for layer in model.layers:
        expected = [["CPU:0", "CPU:2"], ["CPU:1", "CPU:3"]][stages[layer.name]]
        for variable in layer.weights:
            assert devices(variable) == expected, variable.path
    slots = [v for v in model.optimizer.variables if "momentum" in v.path]
    assert len(slots) == len(model.trainable_weights)
    for slot in slots:
        owner = next(name for name in stages if f"_{name}_" in slot.path)
        assert devices(slot) == [["CPU:0", "CPU:2"], ["CPU:1", "CPU:3"]][stages[owner]]
    text = str(report)
    assert "stages (auto (static)): imbalance" in text
    assert "stage 1: 2 layer(s) d2 .. out" in text and "MFLOP/example" in text
    assert report.stages.imbalance >= 1.0


def test_manual_rules_pin_layers_and_auto_places_the_rest():
    config = {"data_parallel": {"mode": "none"},
              "model_parallel": {"stages": 2, "placement": {"auto": "static", "^d0$": 1}}}
    with pytest.raises(ConfigError, match=r"No contiguous cut.*'d0' \(position 0\) -> stage 1"):
        fit_in_scope(config)
    config["model_parallel"]["placement"] = {"auto": "static", "^out$": 1, "^d2$": 1}
    model, hs = fit_in_scope(config)
    rows = {row.path: (row.stage, row.placed_by) for row in hs.describe(model).layers}
    assert rows["out"] == (1, "rule '^out$'") and rows["d0"] == (0, "auto")


def test_profile_reports_measured_time_per_stage():
    model, hs = fit_in_scope({"data_parallel": {"mode": "none"},
                              "model_parallel": {"stages": 2, "placement": {"auto": "profile"}}})
    summary = hs.describe(model).stages
    assert summary.placed == "auto (profile)"
    assert all(row.seconds > 0 and row.layers for row in summary.rows)
    assert "ms measured" in str(hs.describe(model))


def test_more_stages_than_layers_is_refused_with_the_layers():
    config = {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": 4}}
    with pytest.raises(ConfigError, match=r"cannot cut 2 layer\(s\) \(d0, out\) into "
                                          r"model_parallel.stages=4"):
        fit_in_scope(config, build=lambda: mlp(widths=(8,)))


def test_a_layer_too_large_for_a_device_is_refused_before_training():
    config = {"data_parallel": {"mode": "none"},
              "model_parallel": {"stages": 2, "device_memory_bytes": 2000}}
    with pytest.raises(ConfigError, match=r"'d1' \(4,224 bytes\).*device_memory_bytes=2,000"):
        fit_in_scope(config)


def test_the_cut_must_come_before_the_optimizer_is_built():
    config = {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": 2}}
    with hybridpar.scope(config) as hs:
        model = mlp()
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)
        with pytest.raises(ConfigError, match="before its optimizer is built"):
            hs.describe(model)


def test_auto_cut_with_microbatches_trains_like_one_device():
    keras.utils.set_random_seed(3)
    config = {"data_parallel": {"mode": "none"},
              "model_parallel": {"stages": 2, "microbatches": 4}}
    with hybridpar.scope(config):
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    twin = single_device_twin(mlp, model, {"optimizer": keras.optimizers.SGD(0.1),
                                           "loss": "mse"})
    for each in (model, twin):
        each.fit(X, Y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    assert max_weight_difference(twin.get_weights(), model.get_weights()) <= 1e-5

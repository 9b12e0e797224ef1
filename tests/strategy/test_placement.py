"""Model parallelism by layer placement, alone and with data parallelism.

Runs on the 4 logical CPU devices of the test session (tests/conftest.py).
"""

import os
import pathlib
import re
import subprocess
import sys

import hybridpar_models
import keras
import numpy as np
import pytest
import tensorflow as tf

import hybridpar
from hybridpar import ConfigError

pytestmark = pytest.mark.strategy

GLOBAL_BATCH = 64
EPOCHS = 2
TRANSFORMER_RULES = {"^(embed|block_0)$": 0, "^(block_1|head.*)$": 1}
PLACEMENT_SCRIPT = pathlib.Path(__file__).with_name("placement_log.py")
PLACER_LINE = re.compile(r"placer\.cc:\d+\] (\S+): \(MatMul\): (\S+)")


def local(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"/device:{spec.device_type}:{spec.device_index}"


def parts(variable) -> list:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return list(getattr(value, "values", [value]))


def digits(data_dir: str) -> tf.data.Dataset:
    return (
        hybridpar.data.load_tfds("hybridpar_digits", "train", data_dir, as_supervised=True)
        .take(640)
        .shuffle(1024, seed=3)
        .batch(GLOBAL_BATCH)
    )


def train(config: dict, data_dir: str, optimizer=None):
    """Trains a 2-block digits_transformer; returns (model, hybrid strategy).

    ``optimizer`` is a factory: the optimizer must be made inside the scope.
    """
    keras.utils.set_random_seed(11)
    config = {**config, "data": {"global_batch_size": GLOBAL_BATCH}}
    with hybridpar.scope(config) as hs:
        model = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
        model.compile(
            optimizer=optimizer() if optimizer else keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(digits(data_dir), epochs=EPOCHS, shuffle=False, verbose=0)
    return model, hs


@pytest.fixture(scope="module")
def single_device(digits_data_dir):
    model, _ = train({"data_parallel": {"mode": "none"}}, digits_data_dir)
    return [np.asarray(w) for w in model.get_weights()]


@pytest.fixture(scope="module")
def hybrid_2x2(digits_data_dir):
    return train(
        {
            "data_parallel": {"mode": "mirrored"},
            "model_parallel": {"stages": 2, "placement": TRANSFORMER_RULES},
        },
        digits_data_dir,
        optimizer=lambda: keras.optimizers.Adam(learning_rate=1e-3),
    )


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def test_2x2_places_every_variable_and_slot_on_its_stage_devices(hybrid_2x2):
    model, hs = hybrid_2x2
    assert (hs.mode, hs.num_replicas) == ("mirrored", 2)
    stage_devices = {0: ["/device:CPU:0", "/device:CPU:2"], 1: ["/device:CPU:1", "/device:CPU:3"]}
    expected = {}
    for variable in model.weights:
        stage = 1 if variable.path.split("/")[0] in ("block_1", "head_norm", "head") else 0
        expected[variable.path] = stage
        assert [local(p.device) for p in parts(variable)] == stage_devices[stage], variable.path
    slots = [v for v in model.optimizer.variables if "_momentum" in v.path or "_velocity" in v.path]
    assert len(slots) == 2 * len(model.trainable_weights)
    for slot in slots:
        owner = next(p for p in expected if slot.path.split("/")[1].startswith(p.replace("/", "_")))
        assert [local(p.device) for p in parts(slot)] == stage_devices[expected[owner]], slot.path


def test_2x2_replica_copies_stay_identical(hybrid_2x2):
    model, _ = hybrid_2x2
    for variable in model.weights + model.optimizer.variables:
        copies = [p.numpy() for p in parts(variable)]
        assert len(copies) == 2
        np.testing.assert_array_equal(copies[0], copies[1], err_msg=variable.path)


def test_2x2_trains_like_one_device(single_device, digits_data_dir):
    model, _ = train(
        {
            "data_parallel": {"mode": "mirrored"},
            "model_parallel": {"stages": 2, "placement": TRANSFORMER_RULES},
        },
        digits_data_dir,
    )
    difference = max_difference(single_device, [np.asarray(w) for w in model.get_weights()])
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


def test_pure_model_parallel_1x4_trains_like_one_device(single_device, digits_data_dir):
    rules = {"^embed$": 0, "^block_0$": 1, "^block_1$": 2, "^head": 3}
    model, hs = train(
        {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": 4, "placement": rules}},
        digits_data_dir,
    )
    assert (hs.mode, hs.num_replicas) == ("none", 1)
    devices = {local(p.device) for v in model.weights for p in parts(v)}
    assert devices == {f"/device:CPU:{i}" for i in range(4)}
    difference = max_difference(single_device, [np.asarray(w) for w in model.get_weights()])
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


def test_forward_and_backward_ops_run_on_the_stage_devices():
    """Reads TensorFlow's own placer log (a fresh process with log_device_placement)."""
    result = subprocess.run(
        [sys.executable, str(PLACEMENT_SCRIPT)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # op name -> device, for every MatMul of the model's dense layers.
    placed = dict(PLACER_LINE.findall(result.stderr))
    assert placed, result.stderr[-3000:]
    kinds = {"forward": {}, "backward": {}}
    for name, device in placed.items():
        kind = "backward" if "gradient_tape/" in name else "forward"
        replica = 1 if "replica_1/" in name else 0
        layer = next(layer for layer in ("body", "mid", "head") if f"/{layer}_" in name
                     or f"/{layer}/" in name)
        kinds[kind].setdefault((replica, layer), set()).add(device[-5:])
    expected = {(0, "body"): {"CPU:0"}, (0, "mid"): {"CPU:1"}, (0, "head"): {"CPU:1"},
                (1, "body"): {"CPU:2"}, (1, "mid"): {"CPU:3"}, (1, "head"): {"CPU:3"}}
    assert kinds["forward"] == expected
    assert kinds["backward"] == expected


def test_nested_layers_follow_the_outermost_rule(digits_data_dir):
    # "mlp_in" alone would go to stage 0; inside block_1 it follows block_1.
    rules = {"^block_1$": 1, "mlp_in": 0}
    with hybridpar.scope(
        {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": 2, "placement": rules}}
    ) as hs:
        model = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
    devices = {v.path: local(parts(v)[0].device) for v in model.weights}
    assert devices["block_1/mlp_in/kernel"] == "/device:CPU:1"
    assert devices["block_0/mlp_in/kernel"] == "/device:CPU:0"
    report = hs.describe(model)
    rows = {row.path: row for row in report.layers}
    assert rows["block_1/mlp_in"].placed_by == "inside 'block_1'"
    assert rows["block_0/mlp_in"].placed_by == "rule 'mlp_in'"
    assert "embed" in report.unplaced


def test_stage_context_places_layers_built_inside_it():
    with hybridpar.scope(
        {"data_parallel": {"mode": "mirrored"}, "model_parallel": {"stages": 2}}
    ) as hs:
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, name="trunk")(inputs)
        with hybridpar.stage(1):
            head = keras.layers.Dense(2, name="top")
        model = keras.Model(inputs, head(hidden))
        model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=8, verbose=0)
    assert [local(p.device) for p in parts(model.get_layer("top").kernel)] == [
        "/device:CPU:1", "/device:CPU:3"]
    assert hs.describe(model).layers[-1].placed_by == "stage()"


def test_report_counts_weights_and_optimizer_state_per_device(hybrid_2x2, tmp_path):
    model, hs = hybrid_2x2
    report = hs.describe(model)
    text = str(report)
    assert "2 replica(s) x 2 stage(s)" in text and "block_1/mlp_out" in text
    stage_bytes = {
        stage: sum(4 * int(np.prod(w.shape)) for w in model.weights
                   if (w.path.split("/")[0] in ("block_1", "head_norm", "head")) == bool(stage))
        for stage in (0, 1)
    }
    assert report.weight_bytes["/device:CPU:1"] == stage_bytes[1]
    assert report.weight_bytes["/device:CPU:2"] == stage_bytes[0]
    # Adam: two slots per weight on the weight's devices, plus its step and rate on stage 0.
    assert report.optimizer_bytes["/device:CPU:3"] == 2 * stage_bytes[1]
    png = tmp_path / "placement.png"
    report.save_png(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hybrid_model_saves_and_loads_into_one_device_and_back(hybrid_2x2, tmp_path):
    model, _ = hybrid_2x2
    path = tmp_path / "hybrid.keras"
    model.save(path)
    weights = tmp_path / "hybrid.weights.h5"
    model.save_weights(weights)
    expected = [np.asarray(w) for w in model.get_weights()]
    sample = np.random.default_rng(0).uniform(0, 255, size=(5, 8, 8, 1)).astype("float32")
    reference = model.predict(sample, verbose=0)

    single = keras.models.load_model(path)
    assert max_difference(expected, [np.asarray(w) for w in single.get_weights()]) == 0.0
    np.testing.assert_allclose(single.predict(sample, verbose=0), reference, rtol=1e-5, atol=1e-6)
    labels = np.arange(5) % 10
    np.testing.assert_allclose(model.evaluate(sample, labels, verbose=0),
                               single.evaluate(sample, labels, verbose=0), rtol=1e-5)

    config = {
        "data_parallel": {"mode": "mirrored"},
        "model_parallel": {"stages": 2, "placement": TRANSFORMER_RULES},
    }
    with hybridpar.scope(config):
        reloaded = keras.models.load_model(path)
        rebuilt = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
    rebuilt.load_weights(weights)
    for again in (reloaded, rebuilt):
        assert [local(p.device) for p in parts(again.get_layer("head").kernel)] == [
            "/device:CPU:1", "/device:CPU:3"]
        assert max_difference(expected, [np.asarray(w) for w in again.get_weights()]) == 0.0


def staged_model() -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="trunk")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="top")(hidden))


def test_rule_that_matches_no_layer_fails_before_training():
    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": 2, "placement": {"^top$": 1, "^decoder": 1}},
    }
    with hybridpar.scope(config):
        model = staged_model()
        model.compile(optimizer="sgd", loss="mse")
    before = [np.asarray(w) for w in model.get_weights()]
    with pytest.raises(ConfigError, match=r"rule\(s\) '\^decoder' match no layer.*trunk, top"):
        model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), verbose=0)
    assert max_difference(before, [np.asarray(w) for w in model.get_weights()]) == 0.0


def test_layer_matched_by_two_rules_fails_when_built():
    config = {"model_parallel": {"stages": 2, "placement": {"^to": 1, "p$": 0}}}
    with hybridpar.scope(config), pytest.raises(ConfigError, match="Layer 'top' is matched by 2"):
        staged_model()


def test_stage_past_the_configured_stages_fails_when_built():
    with hybridpar.scope({"model_parallel": {"stages": 2}}):
        with hybridpar.stage(2):
            layer = keras.layers.Dense(2, name="far")
        with pytest.raises(ConfigError, match=r"'far' is placed on stage 2 by hybridpar.stage"):
            layer.build((None, 3))


def test_hybrid_checkpoint_restores_into_one_device_and_back(hybrid_2x2, tmp_path):
    model, _ = hybrid_2x2
    hybridpar.checkpoint.save(model, tmp_path / "ckpt")
    expected = weights_of(model) + [np.asarray(v) for v in model.optimizer.variables]

    def fresh(config: dict) -> keras.Model:
        with hybridpar.scope(config):
            again = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
            again.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        hybridpar.checkpoint.restore(again, tmp_path / "ckpt")
        return again

    single = fresh({"data_parallel": {"mode": "none"}})
    hybrid = fresh({"data_parallel": {"mode": "mirrored"},
                    "model_parallel": {"stages": 2, "placement": TRANSFORMER_RULES}})
    for restored in (single, hybrid):
        got = weights_of(restored) + [np.asarray(v) for v in restored.optimizer.variables]
        assert max_difference(expected, got) == 0.0
    assert [local(p.device) for p in parts(hybrid.get_layer("head").kernel)] == [
        "/device:CPU:1", "/device:CPU:3"]


def weights_of(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()]

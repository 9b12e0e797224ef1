"""hybridpar.scope() on real tf.distribute strategies over 4 logical CPUs."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import hybridpar
from hybridpar import ConfigError, RuntimeMismatchError
from hybridpar.checkpoint import tensor_io

pytestmark = pytest.mark.strategy


def small_model() -> keras.Model:
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="dense")])


def variable_devices(model: keras.Model) -> set[str]:
    devices = set()
    for variable in model.weights:
        tf_variable = variable.value
        for copy in getattr(tf_variable, "values", (tf_variable,)):
            devices.add(tf.DeviceSpec.from_string(copy.device).to_string().split("/")[-1])
    return devices


def enter(scope) -> None:
    """Enters ``scope``, failing the test if that succeeds."""
    with scope:
        pytest.fail("the scope must not be entered")


def test_default_scope_is_mirrored_over_every_logical_cpu():
    assert hybridpar.current() is None
    with hybridpar.scope() as hs:
        assert hybridpar.current() is hs
        assert hs.mode == "mirrored"
        assert hs.num_replicas == 4
        assert isinstance(hs.strategy, tf.distribute.MirroredStrategy)
        assert tf.distribute.get_strategy() is hs.strategy
        assert hs.is_chief
        assert len(hs.devices) == 4
    assert hybridpar.current() is None
    assert not tf.distribute.has_strategy()


def test_mode_none_is_one_device():
    with hybridpar.scope({"data_parallel": {"mode": "none"}}) as hs:
        assert hs.mode == "none"
        assert hs.num_replicas == 1
        assert isinstance(hs.strategy, tf.distribute.OneDeviceStrategy)
        assert hs.devices == ("/device:CPU:0",)


def test_mode_none_on_a_listed_device_places_variables_there():
    config = {"data_parallel": {"mode": "none", "devices": ["/cpu:2"]}}
    with hybridpar.scope(config) as hs:
        assert isinstance(hs.strategy, tf.distribute.OneDeviceStrategy)
        model = small_model()
    assert variable_devices(model) == {"device:CPU:2"}


def test_listed_devices_hold_the_mirrored_copies():
    with hybridpar.scope({"data_parallel": {"devices": ["/cpu:1", "/cpu:3"]}}) as hs:
        assert hs.mode == "mirrored" and hs.num_replicas == 2
        model = small_model()
    assert variable_devices(model) == {"device:CPU:1", "device:CPU:3"}


def test_scope_accepts_a_yaml_path(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data_parallel:\n  devices: ['/cpu:0', '/cpu:1']\n")
    with hybridpar.scope(path) as hs:
        assert hs.num_replicas == 2


def test_missing_device_fails_before_any_strategy_and_lists_real_devices():
    config = {"data_parallel": {"devices": ["/cpu:0", "/gpu:0"]}}
    with pytest.raises(RuntimeMismatchError, match=r"/device:GPU:0, which this process does not "
                       r"have. Devices that exist: /device:CPU:0, /device:CPU:1, /device:CPU:2, "
                       r"/device:CPU:3"):
        enter(hybridpar.scope(config))
    assert hybridpar.current() is None


def test_batch_that_does_not_divide_over_replicas_names_both_numbers():
    with pytest.raises(RuntimeMismatchError, match=r"global_batch_size=10 does not divide evenly "
                       r"across 4 replicas"):
        enter(hybridpar.scope({"data": {"global_batch_size": 10}}))


def test_scopes_restore_the_previous_state_on_error():
    with pytest.raises(ZeroDivisionError), hybridpar.scope() as hs:
        assert hybridpar.current() is hs
        1 / 0  # noqa: B018
    assert hybridpar.current() is None
    assert not tf.distribute.has_strategy()


def test_reentering_the_same_strategy_nests():
    with hybridpar.scope() as outer:
        with outer.scope() as inner:
            assert inner is outer and hybridpar.current() is outer
        assert hybridpar.current() is outer
    assert hybridpar.current() is None


def test_nesting_a_different_strategy_is_a_clear_error():
    with hybridpar.scope() as outer:
        with pytest.raises(ConfigError, match="inside another strategy's scope"):
            enter(hybridpar.scope({"data_parallel": {"mode": "none"}}))
        assert hybridpar.current() is outer
        assert tf.distribute.get_strategy() is outer.strategy
    assert hybridpar.current() is None


def test_reentering_a_scope_inside_another_strategy_is_refused():
    with hybridpar.scope({"data_parallel": {"devices": ["/cpu:0"]}}) as first:
        pass
    with hybridpar.scope() as second:
        with pytest.raises(ConfigError, match="cannot nest inside another strategy's scope"):
            enter(first.scope())
        assert hybridpar.current() is second


def test_two_strategies_over_different_devices_do_not_collide():
    results = []
    for devices in (["/cpu:0", "/cpu:1"], ["/cpu:2", "/cpu:3"], ["/cpu:1", "/cpu:2", "/cpu:3"]):
        with hybridpar.scope({"data_parallel": {"devices": devices}}) as hs:
            @tf.function
            def replica_sum():
                return tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0))

            per_replica = hs.strategy.run(replica_sum)
            results.append([float(v) for v in hs.strategy.experimental_local_results(per_replica)])
    assert results == [[2.0, 2.0], [2.0, 2.0], [3.0, 3.0, 3.0]]


def test_ring_implementation_trains():
    config = {"data_parallel": {"devices": ["/cpu:0", "/cpu:1"]},
              "communication": {"implementation": "ring"}}
    with hybridpar.scope(config):
        model = small_model()
        model.compile("sgd", "mse")
    history = model.fit(np.ones((16, 8)), np.zeros((16, 4)), batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_nccl_on_cpus_is_refused():
    config = {"data_parallel": {"mode": "mirrored"}, "communication": {"implementation": "nccl"}}
    with pytest.raises(ConfigError, match="'nccl' needs GPU devices only"):
        enter(hybridpar.scope(config))


@pytest.mark.parametrize(
    "config, match",
    [
        ({"data_parallel": {"mode": "parameter_server"}},
         r"mode='parameter_server' needs a cluster with chief, worker and ps tasks in TF_CONFIG, "
         r"but TF_CONFIG is not set\. Start it with `hybridpar launch --workers 2 --ps 2"),
    ],
)
def test_reserved_features_fail_clearly(config, match):
    with pytest.raises(ConfigError, match=match), hybridpar.scope(config):
        pytest.fail("the scope must not be entered")


def test_gradient_compression_is_refused_in_parameter_server_mode(monkeypatch):
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"],
               "ps": ["localhost:4", "localhost:5"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": "chief", "index": 0}}))
    config = {"communication": {"compression": "powersgd"}}
    with pytest.raises(ConfigError, match=(
        r"communication.compression='powersgd' compresses the synchronous gradient all-reduce "
        r"of modes 'mirrored' and 'multi_worker' .* Received: "
        r"data_parallel.mode='parameter_server' \(resolved from TF_CONFIG\)\. Set "
        r"communication.compression to 'none'")), hybridpar.scope(config):
        pytest.fail("the scope must not be entered")


def test_keras_api_under_the_scope(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x @ np.ones((8, 4), "float32")
    with hybridpar.scope({"data": {"global_batch_size": 16}}) as hs:
        model = small_model()
        model.compile("adam", "mse", metrics=["mae"])
        history = model.fit(x, y, batch_size=16, epochs=2, validation_split=0.25, verbose=0)
        assert history.history["loss"][1] < history.history["loss"][0]
        assert set(model.evaluate(x, y, verbose=0, return_dict=True)) == {"loss", "mae"}
        predictions = model.predict(x, verbose=0)
        assert predictions.shape == (64, 4)
        path = tmp_path / "model.keras"
        model.save(path)
        reloaded_in_scope = keras.models.load_model(path)
        assert hs.strategy.extended.variable_created_in_scope(reloaded_in_scope.weights[0].value)
    reloaded = keras.models.load_model(path)
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), predictions, atol=1e-6)
    np.testing.assert_allclose(reloaded_in_scope.predict(x, verbose=0), predictions, atol=1e-6)


def test_callbacks_come_from_the_config(tmp_path):
    config = {"checkpoint": {"dir": str(tmp_path / "ckpt"), "every_epochs": 1, "keep": 2}}
    x, y = np.ones((32, 8), "float32"), np.zeros((32, 4), "float32")
    with hybridpar.scope(config) as hs:
        model = small_model()
        model.compile("sgd", "mse")
        callbacks = hs.callbacks()
    assert [type(c).__name__ for c in callbacks] == ["PeriodicCheckpoint"]
    model.fit(x, y, batch_size=8, epochs=3, callbacks=callbacks, verbose=0)
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["ckpt-00000008", "ckpt-00000012"]
    fresh = small_model()
    fresh.compile("sgd", "mse")
    hybridpar.checkpoint.restore(fresh, tmp_path / "ckpt")
    np.testing.assert_allclose(fresh.get_weights()[0], model.get_weights()[0])
    assert int(fresh.optimizer.iterations.numpy()) == 12


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    config = {"checkpoint": {"dir": str(tmp_path / "ckpt"), "every_epochs": 1, "keep": 3}}
    x, y = np.ones((32, 8), "float32"), np.zeros((32, 4), "float32")
    with hybridpar.scope(config) as hs:
        model = small_model()
        model.compile("sgd", "mse")
        (checkpoint,) = hs.callbacks()
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[checkpoint], verbose=0)
    (good,) = checkpoint.checkpoints()
    saved = {p.name: p.read_bytes() for p in good.iterdir()}

    def crash_mid_write(partial, pieces, written=()):
        (partial / "state.index").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(tensor_io, "write", crash_mid_write)  # hybridpar's per-task writer
    with pytest.raises(OSError, match="disk full"):  # resumes after epoch 1, saves after 2
        model.fit(x, y, batch_size=8, epochs=2, callbacks=[checkpoint], verbose=0)
    assert checkpoint.checkpoints() == [good]
    assert {p.name: p.read_bytes() for p in good.iterdir()} == saved
    assert sorted(p.name for p in good.parent.iterdir()) == [good.name]  # no partial left


def test_unwritable_checkpoint_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    config = {"checkpoint": {"dir": str(blocker / "ckpt")}}
    with hybridpar.scope(config) as hs:
        hybrid = hs
    with pytest.raises(ConfigError, match=r"checkpoint.dir='.*a_file/ckpt' is not a writable "
                       r"directory"):
        hybrid.callbacks()

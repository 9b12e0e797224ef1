"""A tensor-parallel weight's storage: shards on the group's devices, one whole weight for Keras.

On the session's 4 logical CPUs, a MirroredStrategy over CPU:0 and CPU:2 (2 replicas) with
a group of 2 per replica: shard 0 of each split weight is mirrored over CPU:0 and CPU:2,
shard 1 over CPU:1 and CPU:3. The model is a column Dense then a row Dense (Megatron's MLP
pair, split as ``hybridpar.topology.tensor_layout.auto_layout`` splits it) trained by plain
``model.fit`` with the shards as its trainable variables; layers read each weight whole
(the shards joined), which is what any layer without a split call does.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from hybridpar.compat.shard_views import ShardView
from hybridpar.parallel.split_variable import SplitVariable, split_in_place
from hybridpar.parallel.staging import OnDevices

pytestmark = pytest.mark.strategy

REPLICAS = ("/device:CPU:0", "/device:CPU:2")
SHARDS = (("/device:CPU:0", "/device:CPU:2"), ("/device:CPU:1", "/device:CPU:3"))
LAYOUT = {"up/kernel": 1, "up/bias": 0, "down/kernel": 0}


def split(model):
    """Stores the weights LAYOUT names as shards on SHARDS (what tensor_split does)."""
    for variable in model.weights:
        axis = next((a for suffix, a in LAYOUT.items() if variable.path.endswith(suffix)), None)
        if axis is not None:
            split_in_place(variable, axis, [OnDevices(d) for d in SHARDS])
    return model


class ShardTrained(keras.Sequential):
    """Trains the shards of its split weights (what the tensor-parallel step will list)."""

    @property
    def trainable_variables(self):
        found = []
        for variable in super().trainable_variables:
            if not isinstance(variable._value, SplitVariable):
                found.append(variable)
                continue
            if not hasattr(variable, "_shard_views"):
                variable._shard_views = [ShardView(shard, variable, index) for index, shard
                                         in enumerate(variable._value.variables)]
            found.extend(variable._shard_views)
        return found

    trainable_weights = trainable_variables


def build(cls):
    keras.utils.set_random_seed(3)
    model = cls([keras.Input((6,)), keras.layers.Dense(8, activation="gelu", name="up"),
                 keras.layers.Dense(4, name="down")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(34, 6)).astype("float32"),
            rng.normal(size=(34, 4)).astype("float32"))


@pytest.fixture(scope="module")
def trained():
    x, y = data()
    single = build(keras.Sequential)
    single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    with tf.distribute.MirroredStrategy(REPLICAS).scope():
        split_model = split(build(ShardTrained))
    split_model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return single, split_model


def devices(variable) -> list[str]:
    return [tf.DeviceSpec.from_string(c.device).to_string().split("device:")[-1]
            for c in variable.values]


def test_each_shard_is_mirrored_over_its_device_of_every_replica(trained):
    _, split = trained
    kernel = split.get_layer("up").kernel
    assert isinstance(kernel._value, SplitVariable) and tuple(kernel.shape) == (6, 8)
    assert [devices(shard) for shard in kernel._value.variables] == [
        ["CPU:0", "CPU:2"], ["CPU:1", "CPU:3"]]
    assert [tuple(s.shape) for s in kernel._value.variables] == [(6, 4), (6, 4)]
    assert not isinstance(split.get_layer("down").bias._value, SplitVariable)


def test_the_optimizer_slots_follow_the_shards(trained):
    _, split = trained
    slots = {v.path.split("/")[-1]: devices(v.value) for v in split.optimizer.variables
             if re.search(r"_shard\d", v.path)}
    assert slots["shard_trained_up_kernel_shard1_momentum"] == ["CPU:1", "CPU:3"]
    assert slots["shard_trained_down_kernel_shard0_velocity"] == ["CPU:0", "CPU:2"]
    assert len(slots) == 2 * 6  # momentum and velocity of 3 split weights x 2 shards


def test_fit_trains_the_shards_to_one_devices_weights(trained):
    single, split = trained
    assert [w.shape for w in split.get_weights()] == [(6, 8), (8,), (8, 4), (4,)]
    for expected, got in zip(single.get_weights(), split.get_weights(), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)


def test_a_weights_file_holds_whole_weights_and_loads_into_a_split_model(trained, tmp_path):
    single, split = trained
    path = str(tmp_path / "split.weights.h5")
    split.save_weights(path)
    unsplit = build(keras.Sequential)
    unsplit.load_weights(path)
    for expected, got in zip(split.get_weights(), unsplit.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
    single.save_weights(str(tmp_path / "single.weights.h5"))
    split.load_weights(str(tmp_path / "single.weights.h5"))
    for expected, got in zip(single.get_weights(), split.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
    shard = split.get_layer("up").kernel._value.variables[1]
    expected = single.get_layer("up").kernel.numpy()[:, 4:]
    np.testing.assert_array_equal(shard.values[1].numpy(), expected)

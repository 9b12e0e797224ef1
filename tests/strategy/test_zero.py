"""ZeRO stage 1 (data_parallel.shard_optimizer_state) on MirroredStrategy over 4 logical CPUs.

Sharded training under the unmodified model.fit against unsharded and single-device
training on the same data and seed, the optimizer-slot bytes each device holds (read
from the variables' devices and sizes), and the refusals.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import copy_spread, max_weight_difference  # beside this file's folder

import hybridpar
from hybridpar.parallel import held_bytes, zero_plan

pytestmark = pytest.mark.strategy

BATCH = 32
DEVICES = [f"/cpu:{i}" for i in range(4)]


def config(shard: bool, mode: str = "mirrored", **data_parallel) -> dict:
    if mode == "none":
        return {"data_parallel": {"mode": "none"}}
    return {"data_parallel": {"mode": mode, "devices": DEVICES, "shard_optimizer_state": shard,
                              **data_parallel},
            "data": {"global_batch_size": BATCH}}


def dataset(examples: int = 200) -> tf.data.Dataset:
    """200 examples: 6 full batches and a partial one of 8 (2 per replica)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 16)).astype("float32")
    y = rng.integers(0, 4, examples)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def mlp() -> keras.Model:
    """697 weights (16*33 + 33 + 33*4 + 4): one bucket of 175, 174, 174, 174 per replica."""
    return keras.Sequential([keras.Input((16,)),
                             keras.layers.Dense(33, activation="relu", name="first"),
                             keras.layers.Dense(4, name="second")])


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "lion": lambda: keras.optimizers.Lion(0.001),
    # Keras clips each replica's gradients before they are summed, sharded or not
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
}


def train(run_config: dict, optimizer: str, epochs: int = 2, **compile_options):
    keras.utils.set_random_seed(1)
    with hybridpar.scope(run_config) as hs:
        model = mlp()
        model.compile(OPTIMIZERS[optimizer](),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      **compile_options)
    model.fit(dataset(), epochs=epochs, verbose=0)
    return model, hs


def optimizer_bytes(model: keras.Model, hs) -> dict[str, int]:
    variables = list(model.optimizer.variables)
    if hs.state.zero is not None:
        variables += list(hs.state.zero.state_for(model.optimizer).replica_variables())
    return held_bytes.variable_bytes_by_device(variables)


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam", "adamw"])
def test_sharded_training_equals_unsharded_and_single_device_training(optimizer):
    sharded, hs = train(config(True), optimizer)
    unsharded, _ = train(config(False), optimizer)
    single, _ = train(config(False, "none"), optimizer)
    assert hs.state.zero is not None and hs.num_replicas == 4
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5
    assert max_weight_difference(sharded.get_weights(), single.get_weights()) <= 1e-5
    assert copy_spread(sharded) == 0.0
    assert int(sharded.optimizer.iterations.numpy()) == 14


@pytest.mark.parametrize("composed", [
    {"model_parallel": {"microbatches": 2}},  # gradient accumulation over 2 microbatches
    {"steps_per_execution": 3},  # 7 batches an epoch: executions of 3, 3 and 1
])
def test_sharding_composes_with_accumulation_and_steps_per_execution(composed):
    compile_options = {k: v for k, v in composed.items() if k != "model_parallel"}

    def run(shard: bool, mode: str = "mirrored"):
        run_config = config(shard, mode)
        if "model_parallel" in composed:
            run_config["model_parallel"] = composed["model_parallel"]
        return train(run_config, "adam", **compile_options)

    (sharded, hs), (unsharded, _) = run(True), run(False)
    single, _ = train(config(False, "none"), "adam")  # plain single-device training
    assert hs.state.zero is not None
    assert hs.state.microbatches == composed.get("model_parallel", {}).get("microbatches", 1)
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5
    assert max_weight_difference(sharded.get_weights(), single.get_weights()) <= 1e-5
    assert int(sharded.optimizer.iterations.numpy()) == 14  # one update per batch


def test_several_buckets_train_to_the_unsharded_weights(monkeypatch, caplog):
    """A cap of 200 elements cuts the 697 weights into 2 buckets: the 528-element kernel
    alone, then the other three (169); each is sharded and reduce-scattered on its own."""
    monkeypatch.setattr(zero_plan, "BUCKET_ELEMENTS", 200)
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        sharded, hs = train(config(True), "adam")
    unsharded, _ = train(config(False), "adam")
    plan = hs.state.zero.state_for(sharded.optimizer).plan
    assert [bucket.sizes for bucket in plan.buckets] == [(528,), (33, 132, 4)]
    assert "697 elements in 2 bucket(s); 174 to 175 elements per replica" in caplog.text
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5


STAGES = {"stages": 2, "placement": {"^first$": 0, "^second$": 1}}


def hybrid_runs(optimizer: str, pipeline: dict) -> tuple:
    """Sharded and unsharded 2 x 2 hybrid training, and single-device training."""
    def run(shard: bool):
        return train({**config(shard), "model_parallel": {**STAGES, **pipeline}}, optimizer)

    return run(True), run(False), train(config(False, "none"), optimizer)[0]


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
def test_a_2x2_hybrid_trains_other_optimizers_like_one_device(optimizer):
    (sharded, _), (unsharded, _), single = hybrid_runs(optimizer, {"microbatches": 2})
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5
    assert max_weight_difference(sharded.get_weights(), single.get_weights()) <= 1e-5


@pytest.mark.parametrize("pipeline", [{"microbatches": 1}, {"microbatches": 4},
                                      {"microbatches": 4, "schedule": "1f1b"}])
def test_a_2x2_hybrid_shards_each_stage_over_its_group(pipeline):
    """2 replicas x 2 stages: each stage's buckets are sharded over that stage's devices
    (first layer's 561 weights on CPU 0 and 2, second's 136 on CPU 1 and 3), each shard's
    slots on the device holding its weights; training equals unsharded hybrid training and
    one device."""
    (sharded, hs), (unsharded, hu), single = hybrid_runs("adam", pipeline)
    assert hs.num_replicas == 2 and hs.state.stages == 2
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5
    assert max_weight_difference(sharded.get_weights(), single.get_weights()) <= 1e-5
    assert copy_spread(sharded) == 0.0
    # Adam's 2 slots; 12 B of scalars per optimizer on stage 0 (outer, and replica optimizer)
    assert optimizer_bytes(unsharded, hu) == {
        **{f"/job:localhost/task:0/device:CPU:{i}": 2 * 561 * 4 + 12 for i in (0, 2)},
        **{f"/job:localhost/task:0/device:CPU:{i}": 2 * 136 * 4 for i in (1, 3)}}
    assert optimizer_bytes(sharded, hs) == {
        **{f"/job:localhost/task:0/device:CPU:{i}": 2 * 281 * 4 + 12 + 12 for i in (0, 2)},
        **{f"/job:localhost/task:0/device:CPU:{i}": 2 * 68 * 4 for i in (1, 3)}}


UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_a_compressed_reduce_scatter_rounds_each_share_once(compression, caplog):
    """With SGD(1) one step moves each weight by minus its summed gradient. Each replica's
    share is rounded once to the low dtype and summed in float32, so no element is off by
    more than 2 unit roundoffs of the largest (measured 0.63 for fp16 and 0.92 for bf16;
    the compressed ring all-reduce, which rounds once per hop, measured 1.36 and 1.30)."""
    def one_step(shard: bool, compression: str) -> list[np.ndarray]:
        keras.utils.set_random_seed(7)
        with hybridpar.scope({**config(shard),
                              "communication": {"compression": compression}}) as hs:
            model = mlp()
            model.compile(keras.optimizers.SGD(1.0),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = model.get_weights()
        model.fit(dataset().take(1), epochs=1, verbose=0)
        assert (hs.state.zero is not None) == shard
        return [after - w for after, w in zip(model.get_weights(), before, strict=True)]

    exact = one_step(False, "none")
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        compressed = one_step(True, compression)
    low = {"fp16": "float16", "bf16": "bfloat16"}[compression]
    assert f"gradients reduce-scattered as {low}" in caplog.text
    for e, c in zip(exact, compressed, strict=True):
        error = float(np.max(np.abs(e - c)))
        assert 0 < error <= 2 * UNIT_ROUNDOFF[compression] * float(np.max(np.abs(e)))


def test_compressed_sharded_training_stays_with_compressed_unsharded_training():
    """14 steps of Adam with fp16 reduce-scatters against fp16 all-reduces: both round
    each step's gradient, differently; the weights stay within 5e-4 (measured 4.5e-5)."""
    def run(shard: bool):
        return train({**config(shard), "communication": {"compression": "fp16"}}, "adam")

    (sharded, hs), (unsharded, hu) = run(True), run(False)
    assert hs.state.zero is not None and hu.state.compression is not None
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 5e-4
    assert copy_spread(sharded) == 0.0


def test_powersgd_with_sharding_is_refused():
    powersgd = {**config(True), "communication": {"compression": "powersgd"}}
    with pytest.raises(hybridpar.ConfigError, match=r"PowerSGD compresses whole gradient "
                       r"matrices .* Received: communication.compression='powersgd'"):
        hybridpar.scope(powersgd).__enter__()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["rmsprop", "adagrad", "lion", "adam_global_clipnorm"])
def test_other_element_wise_optimizers_train_to_the_unsharded_weights(optimizer):
    sharded, _ = train(config(True), optimizer, epochs=1)
    unsharded, _ = train(config(False), optimizer, epochs=1)
    assert max_weight_difference(sharded.get_weights(), unsharded.get_weights()) <= 1e-5


def test_each_device_holds_a_quarter_of_adams_slots():
    """Adam keeps two slots per weight: 2 x 697 x 4 B = 5,576 B on every device unsharded;
    sharded, each replica holds two slots of its padded shard, 2 x 175 x 4 B (the shards
    carry 175, 174, 174 and 174 real elements). Scalars (a step count and a learning rate,
    12 B per optimizer: the outer one's mirrored, each replica optimizer's own) come on top."""
    sharded, hs = train(config(True), "adam", epochs=1)
    unsharded, hu = train(config(False), "adam", epochs=1)
    full, shard = optimizer_bytes(unsharded, hu), optimizer_bytes(sharded, hs)
    assert sorted(full) == sorted(shard) and len(full) == 4
    assert set(full.values()) == {5576 + 12}
    assert set(shard.values()) == {2 * 175 * 4 + 12 + 12}
    slots = [v for v in sharded.optimizer.variables if v.shape.rank]
    assert slots == []  # the outer optimizer made no slot
    assert all(v is None for v in sharded.optimizer._momentums)


def test_one_replica_warns_and_trains_unsharded(caplog):
    one = {"data_parallel": {"mode": "mirrored", "devices": ["/cpu:0"],
                             "shard_optimizer_state": True}}
    with caplog.at_level(logging.WARNING, logger="hybridpar"), hybridpar.scope(one) as hs:
        pass
    assert hs.state.zero is None
    assert "shard_optimizer_state=true has no effect with 1 replica" in caplog.text


def test_parameter_server_mode_is_refused():
    with pytest.raises(hybridpar.ConfigError, match=r"shard_optimizer_state=true needs mode "
                       r"'mirrored' or 'multi_worker': the ps tasks .* already hold"):
        hybridpar.StrategyConfig.from_dict(
            {"data_parallel": {"mode": "parameter_server", "shard_optimizer_state": True}})


@pytest.mark.parametrize("make, match", [
    (lambda: keras.optimizers.Lamb(), r"Lamb cannot be sharded: its trust ratio divides "
                                      r"whole-tensor norms\. Received: optimizer=Lamb"),
    (lambda: keras.optimizers.Adam(use_ema=True), r"Adam\(use_ema=True\)"),
    (lambda: keras.optimizers.SGD(gradient_accumulation_steps=2),
     r"gradient_accumulation_steps=2"),
])
def test_an_optimizer_it_cannot_shard_is_refused_before_training(make, match):
    with hybridpar.scope(config(True)):
        model = mlp()
        model.compile(make(), "mse")
    with pytest.raises(hybridpar.ConfigError, match=match):
        model.fit(dataset(), epochs=1, verbose=0)


def test_an_unsharded_strategy_and_plain_keras_keep_their_slots():
    """Without the option, and outside hybridpar, Adam keeps a MirroredVariable slot per
    weight on every device (the upstream behaviour sharding changes)."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = mlp()
        model.compile(keras.optimizers.Adam(), "mse")
        model.optimizer.build(model.trainable_variables)
    held = held_bytes.variable_bytes_by_device(model.optimizer.variables)
    assert set(held.values()) == {5576 + 12}


@pytest.mark.parametrize("optimizer, target", [("adam", 0.27), ("sgd_momentum", 0.30)])
def test_every_byte_sharding_adds_is_a_quarter_of_unsharded_state(optimizer, target):
    """Every variable building and training created, less the model's weights (slots,
    scalars, metrics: held_bytes.created), per device; no variable copies a weight shard."""
    created, alive = {}, []
    for shard in (True, False):
        before = held_bytes.snapshot()
        model, _ = train(config(shard), optimizer)
        created[shard] = held_bytes.created(before, less=model.weights)
        alive.append(model)  # the second snapshot must hold the first run's variables
    ratio = max(created[True][device] / held for device, held in created[False].items())
    assert ratio <= target, (created, ratio)
    assert [v.name for v in held_bytes.live_variables() if v.name.startswith("zero_shard")] == []


def test_save_and_optimizer_variables_under_sharding(tmp_path):
    """The user's optimizer holds its scalars only: the slots live in the replica optimizers
    (and in hybridpar's checkpoints, test_zero_checkpoints.py). A .keras file thus has the
    weights and the optimizer's 2 scalars, no slots: it loads without hybridpar, but Keras
    then skips the optimizer's saved variables (fewer than it built; it warns), so the loaded
    optimizer starts afresh: step 0, zero slots. Resume from hybridpar's checkpoints."""
    model, hs = train(config(True), "adam")
    assert [v.name for v in model.optimizer.variables] == ["iteration", "learning_rate"]
    sharded_slots = list(hs.state.zero.state_for(model.optimizer).replica_variables())
    assert any("momentum" in v.name for v in sharded_slots)
    path = tmp_path / "sharded.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert max_weight_difference(loaded.get_weights(), model.get_weights()) == 0
    variables = loaded.optimizer.variables
    assert len(variables) == 2 + 2 * len(loaded.trainable_weights)
    assert int(loaded.optimizer.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in variables[2:])  # slots not saved: zeros

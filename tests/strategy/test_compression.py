"""Gradient compression (communication.compression) on real strategies over 4 logical CPUs.

fp16/bf16 against the exact all-reduce (one step to the rounding, and trained
weights), PowerSGD against a numpy implementation of the algorithm and in
accuracy on hybridpar_digits, the overflow skip of a LossScaleOptimizer,
hybrid 2 x 2 stages, and checkpoints of PowerSGD's state.
"""

import json
import logging
import shutil

import hybridpar_models
import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import Crash
from test_checkpoints_in_one_process import build, dataset  # beside this file

import hybridpar

pytestmark = pytest.mark.strategy

BATCH = 64
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}


def mirrored(compression: str = "none", devices: int = 4, **powersgd) -> dict:
    config = {"data_parallel": {"mode": "mirrored",
                                "devices": [f"/cpu:{i}" for i in range(devices)]},
              "data": {"global_batch_size": BATCH},
              "communication": {"compression": compression}}
    if powersgd:
        config["communication"]["powersgd"] = powersgd
    return config


def digits(data_dir: str, split: str = "train") -> tf.data.Dataset:
    data = hybridpar.data.load_tfds("hybridpar_digits", split, data_dir, as_supervised=True)
    return data.shuffle(2048, seed=3).batch(BATCH) if split == "train" else data.batch(BATCH)


def train_digits(config: dict, data_dir: str, epochs: int, learning_rate: float = 0.05):
    """digits_mlp trained with SGD + momentum (PowerSGD's optimizer in the paper)."""
    keras.utils.set_random_seed(7)
    with hybridpar.scope(config) as hs:
        model = hybridpar_models.get("digits_mlp")()
        model.compile(keras.optimizers.SGD(learning_rate, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(digits(data_dir), epochs=epochs, shuffle=False, verbose=0)
    accuracy = model.evaluate(digits(data_dir, "test"), verbose=0, return_dict=True)["accuracy"]
    return model, hs, history, accuracy


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def uncompressed_3_epochs(digits_data_dir):
    return train_digits(mirrored(), digits_data_dir, epochs=3)


# ---------------------------------------------------------------------------- fp16 / bf16


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_a_compressed_step_is_the_exact_step_to_the_rounding(compression, digits_data_dir):
    """With SGD(1) one step moves each weight by minus its summed gradient. Each replica's
    share is rounded once to the low dtype and the ring's partial sums once per hop, so
    every element is off by at most a few unit roundoffs of the largest element: the
    tolerance is 8 (measured: about 1.3)."""
    def one_step(compression: str) -> list[np.ndarray]:
        keras.utils.set_random_seed(7)
        with hybridpar.scope(mirrored(compression)):
            model = hybridpar_models.get("digits_mlp")()
            model.compile(keras.optimizers.SGD(1.0),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = model.get_weights()
        model.fit(digits(digits_data_dir).take(1), epochs=1, verbose=0)
        return [after - w for after, w in zip(model.get_weights(), before, strict=True)]

    exact, compressed = one_step("none"), one_step(compression)
    for e, c in zip(exact, compressed, strict=True):
        error = float(np.max(np.abs(e - c)))
        assert 0 < error <= 8 * UNIT_ROUNDOFF[compression] * float(np.max(np.abs(e)))


@pytest.mark.parametrize("compression, tolerance", [("fp16", 1e-2), ("bf16", 5e-2)])
def test_fp16_and_bf16_train_to_the_uncompressed_weights(
    compression, tolerance, uncompressed_3_epochs, digits_data_dir, caplog
):
    """72 steps of SGD + momentum, each rounded as above (measured max weight difference
    9.5e-4 for fp16, 5.6e-3 for bf16, on weights of magnitude 0.1-0.7): the tolerance is
    about ten times that; the test accuracy must not move by more than one example in 100."""
    reference, _, _, reference_accuracy = uncompressed_3_epochs
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model, hs, _, accuracy = train_digits(mirrored(compression), digits_data_dir, epochs=3)
    difference = max_diff(reference.get_weights(), model.get_weights())
    assert difference <= tolerance, f"max abs weight difference {difference:.3g}"
    assert abs(accuracy - reference_accuracy) <= 0.01
    low = {"fp16": "float16", "bf16": "bfloat16"}[compression]
    line = (f"gradient compression {compression}: 4 floating gradient(s) of 38,440 B sent as "
            f"{low}, 0 uncompressed (0 B); 38,440 B -> 19,220 B per step and replica "
            "(ratio 0.5000)")
    assert caplog.text.count(line) == 1
    assert hs.state.compression.report.summary() == line


def test_inf_and_nan_survive_the_fp16_round_trip():
    with hybridpar.scope(mirrored("fp16")) as hs:
        variable = tf.Variable(tf.zeros([4]))
        optimizer = keras.optimizers.SGD()
    values = tf.constant([[1.0, 2.0, 3.0, 6e4], [1.0, np.inf, 3.0, 6e4],
                          [1.0, 2.0, np.nan, 6e4], [1.0, 2.0, 3.0, 6e4]])

    @tf.function
    def reduce():
        def replica():
            gradient = values[tf.distribute.get_replica_context().replica_id_in_sync_group]
            pairs = [(gradient, variable)]
            return hs.state.compression.reducer(optimizer, pairs)(pairs)[0]
        return hs.strategy.run(replica)

    for result in hs.strategy.experimental_local_results(reduce()):
        # 6e4 per replica is 1.5e4 after the division by 4 replicas, and their sum 6e4 fits in
        # float16 (up to 65504); summed undivided (2.4e5) it would overflow to inf.
        np.testing.assert_array_equal(result.numpy(), [4.0, np.inf, np.nan, 2.4e5])


@pytest.mark.parametrize("compression", ["fp16", "powersgd"])
def test_a_loss_scale_optimizer_still_skips_an_overflowing_step(compression):
    """mixed_float16 wraps the optimizer in a LossScaleOptimizer; a batch of inf inputs
    makes every replica's gradients non-finite, and that step must be skipped (weights and
    step counter unchanged, loss scale halved) exactly as without compression."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * BATCH, 32)).astype("float32")
    x[:BATCH] = np.inf
    y = rng.integers(0, 4, size=len(x))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    def train(compression: str) -> keras.Model:
        keras.utils.set_random_seed(5)
        powersgd = {"rank": 2, "min_elements": 0} if compression == "powersgd" else {}
        with hybridpar.scope(mirrored(compression, **powersgd)):
            model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                      keras.layers.Dense(4, dtype="float32")])
            model.compile(keras.optimizers.SGD(0.1),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        initial = model.get_weights()
        model.fit(data.take(1), epochs=1, verbose=0)
        assert max_diff(model.get_weights(), initial) == 0.0  # the overflowing step is skipped
        model.fit(data.skip(1), epochs=1, verbose=0)
        return model

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        exact, compressed = train("none"), train(compression)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(compressed.optimizer, keras.optimizers.LossScaleOptimizer)
    for model in (exact, compressed):
        assert int(model.optimizer.iterations.numpy()) == 3  # 4 batches, 1 skipped
        assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14  # halved once
        assert all(np.isfinite(w).all() for w in model.get_weights())
    if compression == "fp16":
        assert max_diff(exact.get_weights(), compressed.get_weights()) <= 1e-2


# ---------------------------------------------------------------------------- PowerSGD


def powersgd_reference(steps: list[np.ndarray], q: np.ndarray, warmup: int):
    """PowerSGD (Vogels et al. 2019, Algorithms 1 and 2) in numpy, sums over replicas.

    Returns, per step, the summed gradient it uses, then the final error memories and Q.
    """
    errors = np.zeros_like(steps[0])
    used = []
    for index, gradients in enumerate(steps):
        if index < warmup:
            used.append(gradients.sum(axis=0))
            continue
        matrices = gradients + errors
        p_hat = np.linalg.qr(np.einsum("wnm,mr->nr", matrices, q))[0]
        q_locals = np.einsum("wnm,nr->wmr", matrices, p_hat)
        q = q_locals.sum(axis=0)
        used.append(p_hat @ q.T)
        errors = matrices - np.einsum("nr,wmr->wnm", p_hat, q_locals)
    return used, errors, q


@pytest.mark.parametrize("warmup", [0, 1])
def test_powersgd_computes_the_algorithm(warmup):
    rng = np.random.default_rng(1)
    steps = [rng.normal(size=(4, 16, 8)).astype("float32") for _ in range(3)]
    with hybridpar.scope(mirrored("powersgd", rank=2, min_elements=0,
                                  warmup_steps=warmup)) as hs:
        variable = keras.Variable(np.zeros((16, 8), "float32"), name="w")
        optimizer = keras.optimizers.SGD()
        hs.state.compression.prepare_optimizer(hs.strategy, optimizer, [variable])
    state = hs.state.compression.state_for(optimizer)
    (entry,) = state.entries.values()
    q0 = entry.q.values[0].numpy()

    @tf.function
    def reduce(gradients):
        def replica():
            gradient = gradients[tf.distribute.get_replica_context().replica_id_in_sync_group]
            pairs = [(gradient, variable.value)]
            return hs.state.compression.reducer(optimizer, pairs)(pairs)[0]
        return hs.strategy.run(replica)

    used = []
    for gradients in steps:
        results = [r.numpy() for r in hs.strategy.experimental_local_results(reduce(gradients))]
        assert all(np.array_equal(results[0], r) for r in results)  # the same on every replica
        used.append(results[0])
        optimizer.iterations.assign_add(1)
    expected, errors, q = powersgd_reference(steps, q0, warmup)
    for ours, theirs in zip(used, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
    np.testing.assert_allclose(np.stack([e.numpy() for e in entry.error.values]), errors,
                               atol=1e-4)
    assert np.abs(errors).max() > 0.1  # each replica remembers its own, nonzero error
    q_copies = [c.numpy() for c in entry.q.values]
    assert all(np.array_equal(q_copies[0], c) for c in q_copies)
    signs = np.sign(np.sum(q_copies[0] * q, axis=0))  # QR columns are unique up to sign
    np.testing.assert_allclose(q_copies[0] * signs, q, atol=1e-4)


@pytest.mark.slow
def test_powersgd_reaches_the_uncompressed_accuracy(digits_data_dir, caplog):
    """Rank 2, default min_elements (the 64 x 128 hidden kernel compressed, the 128 x 10 head
    and the biases exact), 5 epochs: test accuracy within 0.02 of the exact all-reduce's."""
    _, _, _, exact = train_digits(mirrored(), digits_data_dir, epochs=5)
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        _, _, _, compressed = train_digits(mirrored("powersgd", rank=2), digits_data_dir,
                                           epochs=5)
    assert abs(compressed - exact) <= 0.02, (compressed, exact)
    assert compressed > 0.8
    line = ("gradient compression powersgd (rank 2): 1 gradient(s) of 32,768 B via PowerSGD, "
            "3 uncompressed (5,672 B); 38,440 B -> 7,208 B per step and replica (ratio 0.1875)")
    assert caplog.text.count(line) == 1


def test_hybrid_2x2_with_fp16_keeps_replica_copies_identical(digits_data_dir):
    rules = {"^(embed|block_0)$": 0, "^(block_1|head.*)$": 1}
    keras.utils.set_random_seed(11)
    config = {**mirrored("fp16"), "model_parallel": {"stages": 2, "placement": rules}}
    with hybridpar.scope(config) as hs:
        model = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(digits(digits_data_dir).take(10), epochs=2, verbose=0)
    assert (hs.num_replicas, hs.plan.mesh.stages) == (2, 2)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert hs.state.compression.report.ratio == 0.5
    for variable in model.weights + model.optimizer.variables:
        value = variable.value
        copies = [c.numpy() for c in value.values]
        assert len(copies) == 2
        np.testing.assert_array_equal(copies[0], copies[1], err_msg=variable.path)


def test_a_single_replica_trains_uncompressed_with_a_warning(caplog):
    config = {"data_parallel": {"mode": "none"}, "communication": {"compression": "bf16"}}
    with caplog.at_level(logging.WARNING, logger="hybridpar"), hybridpar.scope(config) as hs:
        model = build()
    assert hs.state.compression is None
    assert ("communication.compression='bf16' has no effect with 1 replica (nothing is "
            "all-reduced); training uncompressed") in caplog.text
    model.fit(dataset().take(2), epochs=1, verbose=0)


def test_a_custom_training_loop_creates_powersgd_state_in_its_first_step():
    with hybridpar.scope(mirrored("powersgd", rank=2, min_elements=0, warmup_steps=1)) as hs:
        model = build()
        model.optimizer.build(model.trainable_variables)
    x, y = next(iter(dataset()))
    batch = hs.strategy.experimental_distribute_values_from_function(
        lambda context: (x[:4], y[:4]))

    @tf.function
    def step(batch):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2) / 4
            gradients = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(gradients, model.trainable_variables,
                                                strict=True))
        hs.strategy.run(replica, args=batch)

    for _ in range(3):
        step(batch)
    assert int(model.optimizer.iterations.numpy()) == 3
    state = hs.state.compression.state_for(model.optimizer)
    (entry,) = state.entries.values()
    assert all(c.numpy().any() for c in entry.error.values)  # trained 2 steps compressed


# ---------------------------------------------------------------------------- checkpoints


def train_checkpointed(directory, crash_at=None, devices=4, compression="powersgd"):
    keras.utils.set_random_seed(3)
    powersgd = {"rank": 2, "min_elements": 0} if compression == "powersgd" else {}
    config = {**mirrored(compression, devices, **powersgd), "data": {"global_batch_size": 16},
              "checkpoint": {"dir": str(directory), "every_steps": 4, "keep": 2}}
    with hybridpar.scope(config) as hs:
        model = build()
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    try:
        model.fit(dataset(), epochs=3, callbacks=callbacks + extra, shuffle=False, verbose=0)
    finally:  # a crash inside this process leaves the write in flight running: as at exit
        callbacks[0].writer.wait()
    return model, hs, callbacks[0]


def powersgd_state(model, hs) -> list[np.ndarray]:
    """Per compressed gradient, every replica's error memory (stacked in replica order), Q."""
    powersgd = hs.state.compression.state_for(model.optimizer)
    arrays = []
    for errors, qs in zip(powersgd.local_errors(hs.strategy), powersgd.local_qs(hs.strategy),
                          strict=True):
        assert [replica for replica, _ in errors] == list(range(hs.num_replicas))
        arrays += [np.stack([error.numpy() for _, error in errors]), qs[0].numpy()]
    return arrays


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    model, hs, _ = train_checkpointed(tmp_path_factory.mktemp("uninterrupted"))
    return model, powersgd_state(model, hs)


@pytest.fixture(scope="module")
def interrupted_once(tmp_path_factory):
    """A run that crashed after step 19 (last checkpoint: step 16), trained once per module."""
    directory = tmp_path_factory.mktemp("interrupted") / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_checkpointed(directory, crash_at=19)
    return directory


@pytest.fixture
def interrupted(interrupted_once, tmp_path):
    """A copy of that run's checkpoints, for a test to resume from or edit."""
    return shutil.copytree(interrupted_once, tmp_path / "ckpt")


def test_resume_with_powersgd_equals_the_uninterrupted_run(uninterrupted, interrupted):
    reference, reference_state = uninterrupted
    manifest = json.loads((interrupted / "ckpt-00000016" / "manifest.json").read_text())
    assert [v["shape"] for v in manifest["variables"]["compression"]] == [[4, 8, 16], [16, 2]]
    resumed, hs, callback = train_checkpointed(interrupted)
    assert callback.restored.step == 16
    assert max_diff(resumed.get_weights(), reference.get_weights()) == 0.0
    state = powersgd_state(resumed, hs)
    assert max_diff(state, reference_state) == 0.0
    assert np.abs(state[0][0] - state[0][1]).max() > 0  # replica-local error memories


def test_a_checkpoint_without_powersgd_state_restores_with_zero_error_memory(
    uninterrupted, interrupted, caplog
):
    manifest_path = interrupted / "ckpt-00000016" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["variables"]["compression"]  # as written by a run without PowerSGD
    manifest_path.write_text(json.dumps(manifest))
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        resumed, _, _ = train_checkpointed(interrupted)
    assert caplog.text.count("PowerSGD error memory starts at zero") == 1
    assert "ckpt-00000016 holds no PowerSGD state" in caplog.text
    # The lost error memory changes the rest of training.
    assert max_diff(resumed.get_weights(), uninterrupted[0].get_weights()) > 1e-4


def test_a_checkpoint_of_another_topology_restores_q_and_zero_error_memory(interrupted, caplog):
    with hybridpar.scope(mirrored("powersgd", devices=2, rank=2, min_elements=0)) as hs:
        model = build()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        found = hybridpar.checkpoint.restore(model, interrupted)
    assert ("holds PowerSGD state of 4 replica(s) (this run: 2 replica(s), rank 2): the "
            "PowerSGD error memory starts at zero.") in caplog.text
    (entry,) = hs.state.compression.state_for(model.optimizer).entries.values()
    assert all(not c.numpy().any() for c in entry.error.values)
    saved = tf.train.load_checkpoint(str(found.path / "state"))
    np.testing.assert_array_equal(entry.q.values[1].numpy(), saved.get_tensor("compression/00001"))

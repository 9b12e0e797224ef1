"""mixed_float16 (with loss scaling) and mixed_bfloat16 under mirrored and a 2 x 2 pipeline
with microbatches, each also with sharded optimizer state, against one device under the
same policy (the tolerance and why:
tests/model_checks.py, MIXED_TOLERANCE_UNITS). The multi-worker and parameter-server
runs are in tests/zoo/test_zoo_cluster.py.
"""

import pathlib

import keras
import model_checks
import numpy as np
import pytest
import tensorflow as tf
from upstream_runner import run_case  # beside this file

import hybridpar

pytestmark = [pytest.mark.strategy, pytest.mark.slow]

RNG = np.random.default_rng(0)
X = RNG.normal(size=(66, 16)).astype("float32")  # a final batch of 2 over 4 replicas
Y = RNG.integers(0, 4, 66)
HYBRID = {"data_parallel": {"mode": "mirrored"},
          "model_parallel": {"stages": 2, "placement": {"^c$": 1}, "microbatches": 2}}
SHARDED = {"data_parallel": {"mode": "mirrored", "shard_optimizer_state": True}}
SHARDED_HYBRID = {**HYBRID, **SHARDED}
UPSTREAM = pathlib.Path(__file__).with_name("upstream_keras.py")


def train(config: dict, policy: str) -> tuple[list, list, str]:
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(2)
        with hybridpar.scope(config):
            model = model_checks.mixed_precision_mlp()
            model.compile(**model_checks.mixed_precision_compile())
            start = model.get_weights()
        model.fit(X, Y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        return start, model.get_weights(), type(model.optimizer).__name__
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("policy", list(model_checks.MIXED_POLICIES))
@pytest.mark.parametrize("config", [{"data_parallel": {"mode": "mirrored"}}, HYBRID, SHARDED,
                                    SHARDED_HYBRID],
                         ids=["mirrored-x4", "2x2-microbatches", "mirrored-x4-sharded",
                              "2x2-microbatches-sharded"])
def test_mixed_precision_trains_like_one_device_under_the_same_policy(policy, config):
    start, single, optimizer = train({"data_parallel": {"mode": "none"}}, policy)
    assert optimizer == ("LossScaleOptimizer" if policy == "mixed_float16" else "SGD")
    distributed_start, distributed, _ = train(config, policy)
    assert model_checks.max_weight_difference(start, distributed_start) == 0.0
    units = model_checks.update_error(start, single, distributed) / (
        model_checks.MIXED_POLICIES[policy])
    assert units <= model_checks.MIXED_TOLERANCE_UNITS, f"{units:.2f} unit roundoffs"


def test_upstream_loss_scaling_applies_another_replicas_overflow():
    """Upstream decides by replica 0's own gradients: replica 1's inf is applied."""
    result = run_case(UPSTREAM, "loss_scale_overflow_on_one_replica")
    assert result == {"finite_weights": False, "scale": 2.0**15, "iterations": 1}, (
        "upstream now checks every replica: revisit compat/loss_scale_finiteness.py")


@pytest.mark.parametrize("shard", [False, True], ids=["unsharded", "sharded"])
def test_an_overflow_on_one_replica_skips_the_step_on_every_replica(shard):
    """Only replica 1's quarter of the first batch is inf. The step is skipped on all 4
    replicas (weights and step count unchanged, scale halved), and the next batches train."""
    x = RNG.normal(size=(64, 16)).astype("float32")
    x[8:16] = np.inf  # replica 1's examples of the first batch of 32
    data = tf.data.Dataset.from_tensor_slices((x, Y[:64])).batch(32)
    config = SHARDED if shard else {"data_parallel": {"mode": "mirrored"}}
    with hybridpar.scope(config) as hs:
        model = model_checks.mixed_precision_mlp()
        model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)),
                      "sparse_categorical_crossentropy")
    start = model.get_weights()
    model.fit(data.take(1), epochs=1, verbose=0)
    assert (hs.state.zero is not None) == shard
    assert model_checks.max_weight_difference(start, model.get_weights()) == 0.0
    assert int(model.optimizer.iterations.numpy()) == 0
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14
    model.fit(data.skip(1), epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert model_checks.copy_spread(model) == 0.0

"""mixed_float16 (with loss scaling) and mixed_bfloat16 under mirrored and a 2 x 2 pipeline
with microbatches, against one device under the same policy (the tolerance and why:
tests/model_checks.py, MIXED_TOLERANCE_UNITS). The multi-worker and parameter-server
runs are in tests/zoo/test_zoo_cluster.py.
"""

import keras
import model_checks
import numpy as np
import pytest

import hybridpar

pytestmark = [pytest.mark.strategy, pytest.mark.slow]

RNG = np.random.default_rng(0)
X = RNG.normal(size=(66, 16)).astype("float32")  # a final batch of 2 over 4 replicas
Y = RNG.integers(0, 4, 66)
HYBRID = {"data_parallel": {"mode": "mirrored"},
          "model_parallel": {"stages": 2, "placement": {"^c$": 1}, "microbatches": 2}}


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
@pytest.mark.parametrize("config", [{"data_parallel": {"mode": "mirrored"}}, HYBRID],
                         ids=["mirrored-x4", "2x2-microbatches"])
def test_mixed_precision_trains_like_one_device_under_the_same_policy(policy, config):
    start, single, optimizer = train({"data_parallel": {"mode": "none"}}, policy)
    assert optimizer == ("LossScaleOptimizer" if policy == "mixed_float16" else "SGD")
    distributed_start, distributed, _ = train(config, policy)
    assert model_checks.max_weight_difference(start, distributed_start) == 0.0
    units = model_checks.update_error(start, single, distributed) / (
        model_checks.MIXED_POLICIES[policy])
    assert units <= model_checks.MIXED_TOLERANCE_UNITS, f"{units:.2f} unit roundoffs"

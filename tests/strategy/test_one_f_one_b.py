"""``model_parallel.schedule: 1f1b``: the GPipe step in less memory.

1F1B must train to the weights of GPipe and of one device without microbatches
(<= 1e-5) on 2 and 4 logical CPUs, on a toy and on keras_hub transformers built
from tiny configs, and its peak activation memory, read from TensorFlow's CPU
allocator, must be at most half of GPipe's at M=8, K=2.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import max_weight_difference, single_device_twin, tiny_keras_hub, token_batch

import hybridpar

pytestmark = pytest.mark.strategy


def dense_stack(stages: int, layers: int, units: int, inputs: int) -> keras.Model:
    x = first = keras.Input((inputs,))
    for stage in range(stages):
        for layer in range(layers):
            x = keras.layers.Dense(units, activation="tanh", name=f"s{stage}_d{layer}")(x)
    return keras.Model(first, keras.layers.Dense(2, name=f"s{stages - 1}_out")(x))


def staged_config(stages: int, microbatches: int, schedule: str, batch: int,
                  placement: dict | None = None) -> dict:
    model_parallel = {"stages": stages, "microbatches": microbatches, "schedule": schedule}
    if placement is not None:
        model_parallel["placement"] = placement
    return {"data_parallel": {"mode": "none"}, "model_parallel": model_parallel,
            "data": {"global_batch_size": batch}}


def compile_kwargs() -> dict:
    return {"optimizer": keras.optimizers.SGD(0.05, momentum=0.9),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def difference_from_one_device(build, config: dict, x, y, batch: int) -> float:
    """Trains ``build()`` under ``config`` and its twin on no strategy from the same
    weights, one epoch each; the largest weight difference."""
    keras.utils.set_random_seed(5)
    with hybridpar.scope(config):
        model = build()
        model.compile(**compile_kwargs())
    twin = single_device_twin(build, model, compile_kwargs())
    for each in (model, twin):
        each.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return max_weight_difference(twin.get_weights(), model.get_weights())


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_four_stages_with_8_microbatches_train_like_one_device(schedule):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    config = staged_config(4, 8, schedule, 32, {f"^s{k}_": k for k in range(4)})
    difference = difference_from_one_device(lambda: dense_stack(4, 2, 12, 6), config, x, y, 32)
    assert difference <= 1e-5, f"{schedule}: max abs weight difference {difference:.3g}"


def test_1f1b_runs_eagerly_like_one_device():
    """``run_eagerly=True`` runs ops in program order; the schedule adds nothing there."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 6)).astype("float32")
    y = (x[:, 1] > 0).astype("int32")
    keras.utils.set_random_seed(5)
    with hybridpar.scope(staged_config(2, 4, "1f1b", 16, {"^s0_": 0, "^s1_": 1})):
        model = dense_stack(2, 1, 8, 6)
        model.compile(run_eagerly=True, **compile_kwargs())
    twin = single_device_twin(lambda: dense_stack(2, 1, 8, 6), model, compile_kwargs())
    for each in (model, twin):
        each.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    difference = max_weight_difference(twin.get_weights(), model.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


def peak_step_bytes(schedule: str) -> int:
    """Allocator bytes above the step's start at the peak of one step (M=8, K=2) of a
    Dense stack whose activations (4096 x 128 floats per layer) outweigh its weights."""
    batch = 4096
    config = staged_config(2, 8, schedule, batch, {"^s0_": 0, "^s1_": 1})
    keras.utils.set_random_seed(5)
    with hybridpar.scope(config):
        model = dense_stack(2, 3, 128, 128)
        model.compile(**compile_kwargs())
    x = np.random.default_rng(0).standard_normal((batch, 128)).astype("float32")
    data = tf.data.Dataset.from_tensors((x, np.zeros(batch, "int32"))).repeat(2)
    model.fit(data.take(1), epochs=1, shuffle=False, verbose=0)  # traced, slots created
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.fit(data.take(1), epochs=1, shuffle=False, verbose=0)
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - start


def test_1f1b_peak_memory_is_at_most_half_of_gpipes():
    gpipe, one_f_one_b = peak_step_bytes("gpipe"), peak_step_bytes("1f1b")
    activations = 8 * 4096 * 128 * 4  # 6 layers' outputs over 2 stages, plus the input
    assert gpipe >= activations // 2, f"GPipe's peak {gpipe} B is not activation-bound"
    assert one_f_one_b <= 0.5 * gpipe, f"1F1B peak {one_f_one_b} B, GPipe {gpipe} B"


def bert_classifier() -> keras.Model:
    backbone = tiny_keras_hub("BertBackbone")
    head = keras.layers.Dense(3, name="classifier")(backbone.output["pooled_output"])
    return keras.Model(backbone.input, head)


def gpt2_language_model() -> keras.Model:
    backbone = tiny_keras_hub("GPT2Backbone")  # GPT2CausalLM's graph: the embedding tied
    logits = backbone.token_embedding(backbone(backbone.input), reverse=True)
    return keras.Model(backbone.input, logits)


def bert_data():
    inputs, ids = token_batch(16)
    inputs["segment_ids"] = np.zeros_like(ids)
    return inputs, ids[:, 0] % 3


def gpt2_data():
    inputs, ids = token_batch(16)
    return inputs, np.roll(ids, -1, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("build, data", [(bert_classifier, bert_data),
                                         (gpt2_language_model, gpt2_data)],
                         ids=["bert", "gpt2"])
def test_keras_hub_transformers_with_microbatches_train_like_one_device(
    build, data, stages, schedule
):
    pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    config = staged_config(stages, 4, schedule, 8)  # placement: auto
    difference = difference_from_one_device(build, config, *data(), 8)
    assert difference <= 1e-5, f"{stages} stages, {schedule}: max abs weight difference " \
                               f"{difference:.3g}"

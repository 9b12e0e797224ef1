"""Models nobody here wrote, cut 2 or 4 ways by ``placement: auto``, train like one device.

keras.applications ResNet50V2 and MobileNetV2 (weights=None, 32x32 inputs) and
keras_hub BERT and GPT-2 backbones built from tiny configs (no downloads). Each
trains without microbatches on 2 or 4 logical CPUs (``mode: none``, one stage each) and on
no strategy from the same weights; the weights must agree within 1e-5, as the
pipeline equivalence tests ask. The transformers take two SGD steps, the
convolutional networks one: at 32x32 their last batch norms normalise 4
examples of 1x1 maps, so the first step's gradients are ~100 and a 6e-8
difference after it (float summation order across two devices) grows to
~5e-4 after the second, on one device as on two.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import max_weight_difference, single_device_twin, tiny_keras_hub, token_batch

import hybridpar

pytestmark = [pytest.mark.strategy, pytest.mark.slow]

BATCH = 4


def staged(stages: int) -> dict:
    return {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": stages}}


def compile_kwargs() -> dict:
    return {"optimizer": keras.optimizers.SGD(0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def trains_like_one_device(build, x, y, stages: int = 2) -> hybridpar.HybridStrategy:
    keras.utils.set_random_seed(5)
    with hybridpar.scope(staged(stages)) as hs:
        model = build()
        model.compile(**compile_kwargs())
    twin = single_device_twin(build, model, compile_kwargs())
    for each in (model, twin):
        each.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    difference = max_weight_difference(twin.get_weights(), model.get_weights())
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"
    assert {row.stage for row in hs.describe(model).layers} == set(range(stages))
    held = {tf.DeviceSpec.from_string(v.value.device).device_index for v in model.weights}
    assert held == set(range(stages))
    return hs, model


def images(classes: int = 10):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, 32, 32, 3)).astype("float32"),
            rng.integers(0, classes, BATCH))


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("application", ["ResNet50V2", "MobileNetV2"])
def test_keras_applications_cut_by_auto_train_like_one_device(application, stages):
    options = {"alpha": 0.35} if application == "MobileNetV2" else {}

    def build():
        return getattr(keras.applications, application)(
            weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None,
            **options)

    trains_like_one_device(build, *images(), stages=stages)


def tokens():
    return token_batch(2 * BATCH)


def test_keras_hub_bert_cut_in_two_trains_like_one_device():
    pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")

    def build():
        backbone = tiny_keras_hub("BertBackbone")
        head = keras.layers.Dense(3, name="classifier")(backbone.output["pooled_output"])
        return keras.Model(backbone.input, head)

    inputs, ids = tokens()
    inputs["segment_ids"] = np.zeros_like(ids)
    trains_like_one_device(build, inputs, ids[:, 0] % 3)


def test_keras_hub_gpt2_tied_embedding_is_placed_once():
    pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")

    def build():  # GPT2CausalLM's graph: the backbone, then its token embedding reversed
        backbone = tiny_keras_hub("GPT2Backbone")
        logits = backbone.token_embedding(backbone(backbone.input), reverse=True)
        return keras.Model(backbone.input, logits)

    inputs, ids = tokens()
    hs, model = trains_like_one_device(build, inputs, np.roll(ids, -1, axis=1))
    shared = hs.describe(model).stages.shared
    backbone = next(layer.name for layer in model.layers  # gpt2_backbone_N after other tests
                    if layer.name.startswith("gpt2_backbone"))
    assert list(shared) == [f"{backbone}/token_embedding placed once on stage 0; uses: "
                      f"{backbone}/token_embedding on stage 0; token_embedding on stage 0, "
                      "input from stage 1"]

"""The models of the conformance suite: none written here, each at a small size.

``keras.applications`` CNNs with ``weights=None`` at 32x32 inputs, keras_hub
models built from config without weights (dropout 0, so that distributed and
single-device training see the same computation): a classifier, causal LMs
(GPT-2, Llama) and a seq2seq LM with per-token losses and temporal sample weights
(the padding mask), a token classifier, and a classifier-and-tagger mixing a
per-example and a per-token loss; a U-Net with a per-pixel loss, a multi-input
multi-output functional model with sample weights, and a subclassed model with its
own ``train_step``. Each ``ZooModel`` builds its model, its data and its compile
arguments; the data has a final batch smaller than the 4 replicas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

BATCH = 16
EXAMPLES = 2 * BATCH + 2  # a final batch of 2 examples: 1, 1 and two padded replicas
VOCABULARY = 64
SEQUENCE = 8


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One row of the conformance table.

    Attributes:
        name: the row's name.
        build: builds the (uncompiled) model.
        data: ``data(examples)`` -> ``(x, y, sample_weight)`` numpy structures
            (``y``/``sample_weight`` may be ``None``).
        compile_kwargs: makes the ``model.compile`` arguments (fresh objects each
            call).
        batch_norm: whether the model has batch-norm layers (then its training
            is not compared with one device: each replica normalises its own
            piece).
    """

    name: str
    build: Callable[[], keras.Model]
    data: Callable[[int], tuple[Any, Any, Any]]
    compile_kwargs: Callable[[], dict[str, Any]]
    batch_norm: bool = False


def _sgd(learning_rate: float = 0.05) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate, momentum=0.9)


def _images(examples: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(1)
    return (rng.uniform(0, 1, (examples, 32, 32, 3)).astype("float32"),
            rng.integers(0, 10, examples), None)


def _classifier_compile() -> dict[str, Any]:
    return {"optimizer": _sgd(0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(),
            "metrics": ["accuracy"]}


def _application(factory: Callable[..., keras.Model], **kwargs: Any) -> Callable[[], keras.Model]:
    def build() -> keras.Model:
        return factory(input_shape=(32, 32, 3), weights=None, classes=10, **kwargs)

    return build


def _tokens(examples: int, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (0 is padding, after a random length) and their padding mask."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, SEQUENCE + 1, examples)
    mask = np.arange(SEQUENCE)[None, :] < lengths[:, None]
    ids = np.where(mask, rng.integers(1, VOCABULARY, (examples, SEQUENCE)), 0)
    return ids.astype("int32"), mask


def _bert(vocabulary: int = VOCABULARY) -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=SEQUENCE, dropout=0.0,
    )
    return keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=None,
                                               dropout=0.0)


def _bert_data(examples: int) -> tuple[Any, Any, Any]:
    ids, mask = _tokens(examples)
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    return x, np.random.default_rng(3).integers(0, 3, examples), None


def _gpt2() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=SEQUENCE, dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def _causal_lm_data(examples: int) -> tuple[Any, Any, Any]:
    """Next-token prediction, as keras_hub's CausalLM preprocessor lays it out."""
    ids, mask = _tokens(examples)
    x = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
    return x, ids[:, 1:], mask[:, 1:].astype("float32")


def _llama() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=32, dropout=0.0,
    )
    return keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)


TAGS = 5


def _bert_backbone() -> keras.Model:
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=SEQUENCE, dropout=0.0,
    )


def _bert_inputs() -> dict[str, keras.KerasTensor]:
    return {"token_ids": keras.Input((SEQUENCE,), dtype="int32", name="token_ids"),
            "segment_ids": keras.Input((SEQUENCE,), dtype="int32", name="segment_ids"),
            "padding_mask": keras.Input((SEQUENCE,), dtype="int32", name="padding_mask")}


def _token_classifier() -> keras.Model:
    """A tag per token on keras_hub's BERT (as its token-classification guides build one)."""
    inputs = _bert_inputs()
    sequence = _bert_backbone()(inputs)["sequence_output"]
    return keras.Model(inputs, keras.layers.Dense(TAGS, name="tags")(sequence))


def _token_classifier_data(examples: int) -> tuple[Any, Any, Any]:
    x, _, _ = _bert_data(examples)
    tags = np.random.default_rng(8).integers(0, TAGS, (examples, SEQUENCE))
    return x, tags, x["padding_mask"].astype("float32")  # padding tokens weigh 0


def _classifier_and_tagger() -> keras.Model:
    """One BERT, a per-example head (the pooled output) and a per-token one."""
    inputs = _bert_inputs()
    outputs = _bert_backbone()(inputs)
    return keras.Model(inputs, {
        "label": keras.layers.Dense(3, name="label")(outputs["pooled_output"]),
        "tags": keras.layers.Dense(TAGS, name="tags")(outputs["sequence_output"])})


def _classifier_and_tagger_data(examples: int) -> tuple[Any, Any, Any]:
    x, labels, _ = _bert_data(examples)
    _, tags, mask = _token_classifier_data(examples)
    weights = np.random.default_rng(9).uniform(0.5, 2.0, examples).astype("float32")
    return x, {"label": labels, "tags": tags}, {"label": weights, "tags": mask}


def _classifier_and_tagger_compile() -> dict[str, Any]:
    logits = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return {"optimizer": _sgd(0.1), "loss": {"label": logits, "tags": logits},
            "loss_weights": {"label": 1.0, "tags": 0.5},
            "weighted_metrics": {"tags": [keras.metrics.SparseCategoricalAccuracy()]}}


def _unet() -> keras.Model:
    """A two-level U-Net (no batch norm) with a class per pixel."""
    images = keras.Input((16, 16, 3))
    down = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(images)
    deeper = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(
        keras.layers.MaxPooling2D()(down))
    up = keras.layers.Conv2DTranspose(8, 2, strides=2, padding="same")(deeper)
    joined = keras.layers.Concatenate()([down, up])
    decoded = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(joined)
    return keras.Model(images, keras.layers.Conv2D(3, 1)(decoded), name="unet")


def _segmentation_data(examples: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(10)
    images = rng.uniform(0, 1, (examples, 16, 16, 3)).astype("float32")
    return images, rng.integers(0, 3, (examples, 16, 16)), None


def _segmentation_compile() -> dict[str, Any]:
    return {"optimizer": _sgd(0.05),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "metrics": ["accuracy"]}


def _bart() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.BartBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=SEQUENCE, dropout=0.0,
    )
    return keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)


def _seq2seq_data(examples: int) -> tuple[Any, Any, Any]:
    source, source_mask = _tokens(examples, seed=4)
    target, target_mask = _tokens(examples, seed=5)
    x = {"encoder_token_ids": source, "encoder_padding_mask": source_mask,
         "decoder_token_ids": target[:, :-1], "decoder_padding_mask": target_mask[:, :-1]}
    return x, target[:, 1:], target_mask[:, 1:].astype("float32")


def _lm_compile() -> dict[str, Any]:
    """Per-token losses, weighted by the padding mask (temporal sample weights)."""
    return {"optimizer": _sgd(0.1),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy()]}


def _two_towers() -> keras.Model:
    """Two named inputs, a shared layer, two named outputs with their own losses."""
    image = keras.Input((6,), name="features")
    tokens = keras.Input((SEQUENCE,), dtype="int32", name="tokens")
    shared = keras.layers.Dense(12, activation="relu", name="shared")
    embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCABULARY, 6)(tokens))
    joined = keras.layers.Concatenate()([shared(image), shared(embedded)])
    label = keras.layers.Dense(3, name="label")(joined)
    score = keras.layers.Dense(1, name="score")(joined)
    return keras.Model({"features": image, "tokens": tokens}, {"label": label, "score": score},
                       name="two_towers")


def _two_towers_data(examples: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(6)
    ids, _ = _tokens(examples)
    x = {"features": rng.normal(size=(examples, 6)).astype("float32"), "tokens": ids}
    y = {"label": rng.integers(0, 3, examples),
         "score": rng.normal(size=(examples, 1)).astype("float32")}
    weights = rng.uniform(0.5, 2.0, examples).astype("float32")
    return x, y, {"label": weights, "score": weights[::-1].copy()}


def _two_towers_compile() -> dict[str, Any]:
    return {"optimizer": _sgd(0.05),
            "loss": {"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     "score": keras.losses.MeanSquaredError()},
            "loss_weights": {"label": 1.0, "score": 0.5},
            "metrics": {"label": ["accuracy"]},
            "weighted_metrics": {"score": [keras.metrics.MeanAbsoluteError()]}}


@keras.saving.register_keras_serializable(package="hybridpar_zoo")
class ContrastiveStep(keras.Model):
    """A subclassed model with a ``train_step`` of its own, as Keras's guide writes one
    (``x, y = data``, ``compute_loss``, ``apply_gradients``, its own metrics)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.logits = keras.layers.Dense(4)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.logits(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def _subclassed_data(examples: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(7)
    return rng.normal(size=(examples, 10)).astype("float32"), rng.integers(0, 4, examples), None


def _subclassed_compile() -> dict[str, Any]:
    return {"optimizer": _sgd(0.05),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


_BERT_COMPILE = lambda: {**_classifier_compile(), "optimizer": _sgd(0.1),  # noqa: E731
                         "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}

MODELS = {
    model.name: model
    for model in (
        ZooModel("MobileNetV2", _application(keras.applications.MobileNetV2, alpha=0.35),
                 _images, _classifier_compile, batch_norm=True),
        ZooModel("EfficientNetB0", _application(keras.applications.EfficientNetB0),
                 _images, _classifier_compile, batch_norm=True),
        ZooModel("ResNet50V2", _application(keras.applications.ResNet50V2),
                 _images, _classifier_compile, batch_norm=True),
        ZooModel("DenseNet121", _application(keras.applications.DenseNet121),
                 _images, _classifier_compile, batch_norm=True),
        ZooModel("BertTextClassifier", _bert, _bert_data, _BERT_COMPILE),
        ZooModel("GPT2CausalLM", _gpt2, _causal_lm_data, _lm_compile),
        ZooModel("LlamaCausalLM", _llama, _causal_lm_data, _lm_compile),
        ZooModel("BartSeq2SeqLM", _bart, _seq2seq_data, _lm_compile),
        ZooModel("BertTokenClassifier", _token_classifier, _token_classifier_data, _lm_compile),
        ZooModel("BertClassifierAndTagger", _classifier_and_tagger, _classifier_and_tagger_data,
                 _classifier_and_tagger_compile),
        ZooModel("UNetSegmenter", _unet, _segmentation_data, _segmentation_compile),
        ZooModel("TwoTowersFunctional", _two_towers, _two_towers_data, _two_towers_compile),
        ZooModel("SubclassedTrainStep", ContrastiveStep, _subclassed_data, _subclassed_compile),
    )
}

# Parameter servers hold embedding tables: a BERT whose 20,000 x 16 token embedding is
# 98% of its weights (the data uses its first rows only).
PS_MODELS = {"BertWideVocabulary": ZooModel("BertWideVocabulary", lambda: _bert(20_000),
                                            _bert_data, _BERT_COMPILE)}
ALL_MODELS = {**MODELS, **PS_MODELS}

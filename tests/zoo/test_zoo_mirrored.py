"""The model zoo under ``data_parallel.mode: mirrored`` on the 4 logical CPUs.

Each row trains a model nobody here wrote for 2 epochs on 34 examples in batches of 16,
fed both ways users feed it (numpy arrays, and a ``tf.data`` dataset batched without
``drop_remainder``, whose batch dimension is dynamic): the final batch of 2 is split 1,
1 with two padded replicas. Asserted: ``fit``, ``evaluate`` and
``predict`` run, ``predict`` returns exactly the input's rows and equals the same
weights' single-device ``predict``, ``evaluate`` equals theirs (one device runs both
on one batch of all the examples: one trace each, the same figures), a ``.keras`` save
reloads to the same predictions, batch-norm statistics are finite with every mirrored
copy equal, and models without batch norm train to the single-device weights.
"""

from __future__ import annotations

import keras
import model_checks
import numpy as np
import pytest
import tensorflow as tf
import zoo_models  # beside this file
from zoo_models import BATCH, EXAMPLES, MODELS

import hybridpar

pytestmark = [pytest.mark.zoo, pytest.mark.strategy, pytest.mark.slow]

TOLERANCE = 1e-5
FEEDS = ("numpy", "tf.data")
EPOCHS = 2


def train(zoo: zoo_models.ZooModel, config: dict, feed: str
          ) -> tuple[keras.Model, hybridpar.HybridStrategy]:
    """Two epochs of ``zoo`` under ``config`` (a mode, or a whole config), fed by ``feed``."""
    keras.utils.set_random_seed(11)
    x, y, weights = zoo.data(EXAMPLES)
    config = {"data_parallel": {"mode": config}} if isinstance(config, str) else config
    with hybridpar.scope(config) as hs:
        model = zoo.build()
        model.compile(**zoo.compile_kwargs())
    if feed == "numpy":
        history = model.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=EPOCHS,
                            shuffle=False, verbose=0)
    else:
        parts = tuple(part for part in (x, y, weights) if part is not None)
        dataset = tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)
        history = model.fit(dataset, epochs=EPOCHS, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * 3  # 16, 16 and 2
    return model, hs


def twin_of(zoo: zoo_models.ZooModel, model: keras.Model) -> keras.Model:
    """The same weights in a model built and compiled outside any strategy."""
    twin = zoo.build()
    if not twin.built:  # a subclassed model builds on its first call
        twin(keras.tree.map_structure(lambda a: a[:1], zoo.data(1)[0]))
    return model_checks.single_device_twin(lambda: twin, model, zoo.compile_kwargs())


def evaluation(model: keras.Model, zoo: zoo_models.ZooModel, batch: int = BATCH
               ) -> dict[str, float]:
    """``evaluate``'s figures, without a multi-output model's per-output losses.

    Keras weighs those (``CompileLoss``: ``sample_weight=y_pred.shape[0]``, None for a
    dynamic batch) by batch, not by example, and the twin evaluates every example in one
    batch; the total loss and the metrics are example-weighted and compared (per-output
    figures against one device in batches of the same size: ``test_loss_ranks``).
    """
    x, y, weights = zoo.data(EXAMPLES)
    figures = model.evaluate(x, y, sample_weight=weights, batch_size=batch, verbose=0,
                             return_dict=True)
    outputs = len(keras.tree.flatten(model.output)) if hasattr(model, "output") else 1
    return {k: v for k, v in figures.items()
            if outputs == 1 or k == "loss" or not k.endswith("_loss")}


# The suite's longest rows (1.5 to 2.5 minutes each) are zoo_heavy: the CNNs fed by tf.data,
# and the two longest fed by numpy (DenseNet121 150 s, EfficientNetB0 103 s in make test).
HEAVY_NUMPY = ("DenseNet121", "EfficientNetB0")


def _heavy(name: str, feed: str) -> bool:
    return MODELS[name].batch_norm and (feed == "tf.data" or name in HEAVY_NUMPY)


CASES = [pytest.param(name, feed, id=f"{name}-{feed}",
                      marks=[pytest.mark.zoo_heavy] if _heavy(name, feed) else [])
         for name in MODELS for feed in FEEDS]


def test_every_zoo_model_is_fed_both_ways():
    fed = {name: set() for name in MODELS}
    for case in CASES:
        fed[case.values[0]].add(case.values[1])
    assert {name for name, feeds in fed.items() if feeds != set(FEEDS)} == set()


@pytest.mark.parametrize("name, feed", CASES)
def test_zoo_model_under_mirrored(name, feed, tmp_path, record_property):
    zoo = MODELS[name]
    model, hs = train(zoo, "mirrored", feed)
    assert hs.num_replicas == 4
    row: dict = {"model": name, "mode": f"mirrored x4, {feed}"}
    if zoo.batch_norm:
        assert model_checks.batch_norm_statistics_finite(model)
        assert model_checks.copy_spread(model) == 0.0
    else:
        single, _ = train(zoo, "none", feed)
        row["weights"] = model_checks.max_weight_difference(single.get_weights(),
                                                            model.get_weights())
        assert row["weights"] <= TOLERANCE, row

    x = zoo.data(EXAMPLES)[0]
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    twin = twin_of(zoo, model)
    expected = twin.predict(x, batch_size=EXAMPLES, verbose=0)  # one batch: one trace
    model_checks.assert_outputs_close(predicted, expected, atol=TOLERANCE)
    row["predict"] = max(float(np.max(np.abs(a - e))) for a, e in zip(
        keras.tree.flatten(predicted), keras.tree.flatten(expected), strict=True))

    figures, reference = evaluation(model, zoo), evaluation(twin, zoo, EXAMPLES)
    assert figures.keys() == reference.keys()
    row["evaluate"] = max(abs(figures[k] - v) / max(1.0, abs(v)) for k, v in reference.items())
    assert row["evaluate"] <= TOLERANCE, (figures, reference)  # relative beyond 1

    path = tmp_path / f"{name}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    assert model_checks.max_weight_difference(reloaded.get_weights(), model.get_weights()) == 0
    model_checks.assert_outputs_close(reloaded.predict(x, batch_size=EXAMPLES, verbose=0),
                                      expected, atol=TOLERANCE)
    record_property("zoo", row)


# 2 replicas x 2 stages (placement: auto) with 2 microbatches, and ZeRO over 4 replicas:
# the final batch of 2 leaves one replica 1 example in 2 microbatches (one of padding).
MODES = {
    "2x2-microbatches": {"data_parallel": {"mode": "mirrored"},
                         "model_parallel": {"stages": 2, "microbatches": 2}},
    "2x2-1f1b": {"data_parallel": {"mode": "mirrored"},
                 "model_parallel": {"stages": 2, "microbatches": 2, "schedule": "1f1b"}},
    "zero": {"data_parallel": {"mode": "mirrored", "shard_optimizer_state": True}},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["GPT2CausalLM", "LlamaCausalLM"])
def test_causal_lms_under_pipelines_and_sharding(name, mode, record_property):
    """SGD with momentum, fed by ``tf.data``: per-token losses with the padding mask as
    temporal sample weights train to one device's weights."""
    zoo = MODELS[name]
    model, _ = train(zoo, MODES[mode], "tf.data")
    single, _ = train(zoo, "none", "tf.data")
    difference = model_checks.max_weight_difference(single.get_weights(), model.get_weights())
    assert difference <= TOLERANCE, f"{name} {mode}: max abs weight difference {difference:.3g}"
    x = zoo.data(EXAMPLES)[0]
    model_checks.assert_outputs_close(model.predict(x, batch_size=BATCH, verbose=0),
                                      single.predict(x, batch_size=BATCH, verbose=0),
                                      atol=TOLERANCE)
    record_property("zoo", {"model": name, "mode": mode, "weights": difference})

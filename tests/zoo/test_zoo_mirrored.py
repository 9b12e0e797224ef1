"""The model zoo under ``data_parallel.mode: mirrored`` on the 4 logical CPUs.

Each row trains a model nobody here wrote on 34 examples in batches of 16: the final
batch of 2 is split 1, 1 with two padded replicas. Asserted: ``fit``, ``evaluate`` and
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
import zoo_models  # beside this file
from zoo_models import BATCH, EXAMPLES, MODELS

import hybridpar

pytestmark = [pytest.mark.zoo, pytest.mark.strategy, pytest.mark.slow]

TOLERANCE = 1e-5


def train(zoo: zoo_models.ZooModel, mode: str) -> tuple[keras.Model, hybridpar.HybridStrategy]:
    keras.utils.set_random_seed(11)
    x, y, weights = zoo.data(EXAMPLES)
    with hybridpar.scope({"data_parallel": {"mode": mode}}) as hs:
        model = zoo.build()
        model.compile(**zoo.compile_kwargs())
    history = model.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1,
                        shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
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
    dynamic batch) by batch, not by example, and under a strategy each replica's piece
    is a batch; the total loss and the metrics are example-weighted and compared.
    """
    x, y, weights = zoo.data(EXAMPLES)
    figures = model.evaluate(x, y, sample_weight=weights, batch_size=batch, verbose=0,
                             return_dict=True)
    outputs = len(keras.tree.flatten(model.output)) if hasattr(model, "output") else 1
    return {k: v for k, v in figures.items()
            if outputs == 1 or k == "loss" or not k.endswith("_loss")}


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_under_mirrored(name, tmp_path, record_property):
    zoo = MODELS[name]
    model, hs = train(zoo, "mirrored")
    assert hs.num_replicas == 4
    row: dict = {"model": name, "mode": "mirrored x4"}
    if zoo.batch_norm:
        assert model_checks.batch_norm_statistics_finite(model)
        assert model_checks.copy_spread(model) == 0.0
    else:
        single, _ = train(zoo, "none")
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

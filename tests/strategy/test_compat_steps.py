"""Training functions of owned models: no per-step Optional, steps_per_execution, XLA.

Each fix (``optional_outputs``, ``step_loop``, ``xla_replicas``) is first
reproduced upstream in a fresh process without hybridpar
(tests/strategy/upstream_keras.py), then tested against single-device
training on the same data and seed (44 examples in batches of 8: a final
partial batch that leaves replicas with different example counts).
"""

import inspect
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
import upstream_keras  # beside this file; pytest puts its folder on sys.path
from upstream_runner import run_case  # beside this file

import hybridpar
from hybridpar import ConfigError

pytestmark = pytest.mark.strategy

UPSTREAM = pathlib.Path(__file__).with_name("upstream_keras.py")
TOLERANCE = 1e-5
EPOCHS = 2
STEPS = 6 * EPOCHS  # 44 examples in batches of 8


def train(config: dict, steps_per_execution: int = 1, jit_compile: bool = False,
          model_fn=upstream_keras.small_mlp, callbacks=()) -> keras.Model:
    with hybridpar.scope(config):
        model = model_fn()
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
    model.fit(upstream_keras.partial_dataset(), epochs=EPOCHS, verbose=0,
              callbacks=list(callbacks))
    return model


def max_difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.max(np.abs(x - y)))
               for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


@pytest.fixture(scope="module")
def one_device() -> keras.Model:
    return train({"data_parallel": {"mode": "none"}})


MIRRORED = {"data_parallel": {"mode": "mirrored"}}
HYBRID = {"data_parallel": {"mode": "mirrored"},
          "model_parallel": {"stages": 2, "placement": {"^out$": 1}}}
PIPELINED = {"data_parallel": {"mode": "mirrored"},
             "model_parallel": {"stages": 2, "placement": {"^out$": 1}, "microbatches": 2}}


def traced_graph(model: keras.Model) -> tf.Graph:
    """The graph of the traced train function hybridpar built for ``model``."""
    traced = inspect.getclosurevars(model.train_function).nonlocals["traced"]
    return traced._list_all_concrete_functions()[0].graph


# ----------------------------------------------------------------- optional_outputs


@pytest.mark.slow
def test_upstream_each_step_opens_an_optional_eagerly():
    per_step = run_case(UPSTREAM, "eager_optional_ops")["per_step"]
    assert per_step == [{"has_value": 1, "get_value": 1}] * 6


@pytest.mark.parametrize("config", [MIRRORED, {"data_parallel": {"mode": "none"}}],
                         ids=["mirrored", "none"])
def test_owned_steps_run_no_eager_optional_op(config, one_device, monkeypatch):
    counts = upstream_keras.count_eager_optional_ops(monkeypatch.setattr)
    recorder = upstream_keras.OpsPerStep(counts)
    model = train(config, callbacks=[recorder])
    assert recorder.per_step == [{"has_value": 0, "get_value": 0}] * STEPS
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert max_difference(model, one_device) <= TOLERANCE


# ----------------------------------------------------------------- step_loop


@pytest.mark.slow
def test_upstream_steps_per_execution_fails_under_mirrored():
    outcome = run_case(UPSTREAM, "steps_per_execution_mirrored")["outcome"]
    assert outcome.startswith("InvalidArgumentError") and "must feed a value" in outcome


@pytest.mark.parametrize("steps_per_execution", [3, 4])
@pytest.mark.parametrize("config", [{"data_parallel": {"mode": "none"}}, MIRRORED, HYBRID,
                                    PIPELINED],
                         ids=["none", "mirrored", "hybrid_2x2", "pipelined_2x2_m2"])
def test_steps_per_execution_trains_like_one_device(config, steps_per_execution, one_device):
    """3 divides the 6 batches of an epoch; 4 leaves a last execution of 2 batches."""
    batches = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(batch)

    model = train(config, steps_per_execution=steps_per_execution, callbacks=[Batches()])
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert len(batches) == EPOCHS * -(-6 // steps_per_execution)
    difference = max_difference(model, one_device)
    assert difference <= TOLERANCE, f"max abs weight difference {difference:.3g}"


# ----------------------------------------------------------------- xla_replicas


@pytest.mark.slow
def test_upstream_jit_compile_fails_under_mirrored():
    result = run_case(UPSTREAM, "jit_compile_mirrored")
    assert result["jit_compile"] is True
    assert "Trying to access resource" in result["outcome"]
    assert "replica_1" in result["outcome"]


def compiled_devices(model: keras.Model) -> list[str]:
    """Devices of the XLA-compiled function calls in ``model``'s traced train function."""
    graph = traced_graph(model).as_graph_def()
    return sorted(
        node.device[-5:] for function in graph.library.function for node in function.node_def
        if "_XlaMustCompile" in node.attr and node.attr["_XlaMustCompile"].b
    )


@pytest.mark.parametrize("steps_per_execution", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_xla_under_mirrored_trains_like_one_device(steps_per_execution, one_device):
    """Each replica's gradients are compiled for its own device, and train as without XLA."""
    model = train(MIRRORED, steps_per_execution=steps_per_execution, jit_compile=True)
    assert model.jit_compile is True
    assert compiled_devices(model) == [f"CPU:{i}" for i in range(4)]
    assert int(model.optimizer.iterations.numpy()) == STEPS
    difference = max_difference(model, one_device)
    assert difference <= TOLERANCE, f"max abs weight difference {difference:.3g}"
    loss = model.evaluate(upstream_keras.partial_dataset(), verbose=0)
    np.testing.assert_allclose(
        loss, one_device.evaluate(upstream_keras.partial_dataset(), verbose=0), rtol=1e-5)


def test_xla_on_one_device_trains_like_without(one_device):
    model = train({"data_parallel": {"mode": "none"}}, jit_compile=True)
    assert max_difference(model, one_device) <= TOLERANCE


class OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize(("config", "model_fn", "message"), [
    (HYBRID, upstream_keras.small_mlp,
     r"model-parallel step \(data_parallel.mode='mirrored'\).*stages=2"),
    ({"data_parallel": {"mode": "mirrored"}, "model_parallel": {"microbatches": 2}},
     upstream_keras.small_mlp, r"microbatched step.*microbatches=2"),
    (MIRRORED, lambda: OwnStep([keras.Input((4,)), keras.layers.Dense(1)]),
     r"OwnStep.train_step under data_parallel.mode='mirrored'"),
], ids=["stages", "microbatches", "own_train_step"])
def test_xla_that_cannot_compile_fails_before_training(config, model_fn, message):
    with hybridpar.scope(config):
        model = model_fn()
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=True)
    with pytest.raises(ConfigError, match=message):
        model.fit(upstream_keras.partial_dataset(), epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0

"""Pipelined (microbatched) training equals unpipelined training; timelines.

Runs on the 4 logical CPU devices of the test session (tests/conftest.py).
"""

import json

import hybridpar_models
import keras
import numpy as np
import pytest
import tensorflow as tf

import hybridpar
from hybridpar import RuntimeMismatchError

pytestmark = pytest.mark.strategy

GLOBAL_BATCH = 64
RULES = {"^(embed|block_0)$": 0, "^(block_1|head.*)$": 1}


def digits(data_dir: str, batch: int = GLOBAL_BATCH) -> tf.data.Dataset:
    return (
        hybridpar.data.load_tfds("hybridpar_digits", "train", data_dir, as_supervised=True)
        .take(448)
        .shuffle(512, seed=3)
        .batch(batch)
    )


def train(config: dict, data_dir: str, callbacks=(), epochs: int = 2) -> keras.Model:
    """Trains a 2-block digits_transformer with SGD + momentum; returns the model."""
    keras.utils.set_random_seed(5)
    config = {**config, "data": {"global_batch_size": GLOBAL_BATCH}}
    with hybridpar.scope(config):
        model = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(digits(data_dir), epochs=epochs, shuffle=False, verbose=0,
              callbacks=list(callbacks))
    return model


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()]


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def single_device(digits_data_dir):
    return weights(train({"data_parallel": {"mode": "none"}}, digits_data_dir))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_2x2_with_4_microbatches_trains_like_one_device(schedule, single_device, digits_data_dir):
    config = {
        "data_parallel": {"mode": "mirrored"},
        "model_parallel": {"stages": 2, "placement": RULES, "microbatches": 4,
                           "schedule": schedule},
    }
    difference = max_difference(single_device, weights(train(config, digits_data_dir)))
    assert difference <= 1e-5, f"{schedule}: max abs weight difference {difference:.3g}"


@pytest.mark.parametrize("microbatches, schedule",
                         [(1, "gpipe"), (2, "gpipe"), (4, "gpipe"), (8, "gpipe"),
                          (2, "1f1b"), (8, "1f1b")])
def test_1x2_stages_train_alike_for_any_microbatch_count(
    microbatches, schedule, single_device, digits_data_dir
):
    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": 2, "placement": RULES, "microbatches": microbatches,
                           "schedule": schedule},
    }
    difference = max_difference(single_device, weights(train(config, digits_data_dir)))
    assert difference <= 1e-5, (f"M={microbatches}, {schedule}: max abs weight difference "
                                f"{difference:.3g}")


def test_gradient_accumulation_equals_the_large_batch_step(single_device, digits_data_dir):
    config = {"data_parallel": {"mode": "none"}, "model_parallel": {"microbatches": 4}}
    difference = max_difference(single_device, weights(train(config, digits_data_dir)))
    assert difference <= 1e-5, f"max abs weight difference {difference:.3g}"


def test_accumulated_microbatches_run_one_after_another():
    """With one stage, microbatch i+1's forward waits for microbatch i's gradients."""
    from hybridpar.parallel import pipeline

    with hybridpar.scope({"data_parallel": {"mode": "none"}}):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
        model.compile(optimizer="sgd", loss="mse")

    @tf.function
    def step(x, y):
        return pipeline.train_step(model, (x, y), 2, sequential=True)

    graph = step.get_concrete_function(
        tf.TensorSpec((4, 3)), tf.TensorSpec((4, 2))).graph
    waits = [op for op in graph.get_operations()
             if op.type == "Identity" and op.control_inputs
             and any("gradient_tape" in c.name for c in op.control_inputs)]
    assert waits, "the second microbatch does not wait for the first one's gradients"


def test_batch_norm_uses_microbatch_statistics(digits_data_dir):
    """Documented behaviour: each microbatch is normalised with its own statistics
    and the moving statistics are updated once per microbatch."""
    x = np.concatenate([np.zeros((4, 1)), np.full((4, 1), 8.0)]).astype("float32")
    y = np.zeros((8, 1), "float32")
    momentum = 0.5
    with hybridpar.scope({"data_parallel": {"mode": "none"},
                          "model_parallel": {"microbatches": 2}}):
        model = keras.Sequential([keras.Input((1,)),
                                  keras.layers.BatchNormalization(momentum=momentum)])
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    moving_mean = float(model.layers[0].moving_mean.numpy()[0])
    after_first = (1 - momentum) * 0.0            # microbatch 1: mean 0
    expected = momentum * after_first + (1 - momentum) * 8.0  # microbatch 2: mean 8
    assert moving_mean == pytest.approx(expected)  # the whole batch once would give 2.0


def test_microbatches_that_do_not_divide_the_replica_batch_fail_at_scope():
    config = {"data_parallel": {"mode": "mirrored"},
              "model_parallel": {"stages": 2, "microbatches": 4},
              "data": {"global_batch_size": 36}}
    with pytest.raises(RuntimeMismatchError, match=r"per-replica batch 18.*not divisible by "
                                                  r"model_parallel.microbatches=4"):
        hybridpar.scope(config).__enter__()


def test_timeline_shows_the_pipelined_schedule(digits_data_dir, tmp_path):
    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": 2, "placement": RULES, "microbatches": 4},
    }
    timeline = hybridpar.pipeline.PipelineTimeline(tmp_path, steps=2)
    train(config, digits_data_dir, callbacks=[timeline], epochs=1)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "timeline.trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} == {
        f"{phase}{m}" for phase in "FB" for m in range(4)}
    intervals = timeline.intervals
    assert {i.step for i in intervals} == {1, 2}
    assert len(intervals) == 2 * 4 * 2 * 2  # steps x microbatches x stages x phases
    span = {(i.step, i.microbatch, i.stage, i.phase): i for i in intervals}
    for step in (1, 2):
        for m in range(4):
            forward_0, forward_1 = span[step, m, 0, "forward"], span[step, m, 1, "forward"]
            backward_0, backward_1 = span[step, m, 0, "backward"], span[step, m, 1, "backward"]
            # Data dependencies the profiled times must respect: stage 1 finishes a
            # microbatch's forward after stage 0 does, and stage 0 its backward after
            # stage 1 starts it; every phase ends after it starts.
            assert forward_0.end <= forward_1.end
            assert backward_1.start <= backward_0.end
            assert forward_1.end <= backward_1.end
            assert all(i.start <= i.end for i in (forward_0, forward_1, backward_0, backward_1))


def test_1f1b_timeline_shows_each_forward_after_the_backward_it_waits_for(
    digits_data_dir, tmp_path
):
    """Measured, not built: on stage k the profiled forward of microbatch m starts after
    the backward of m - (2 - k) ends, so stage k never holds more than 2 - k microbatches."""
    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": 2, "placement": RULES, "microbatches": 4,
                           "schedule": "1f1b"},
    }
    timeline = hybridpar.pipeline.PipelineTimeline(tmp_path, steps=2)
    train(config, digits_data_dir, callbacks=[timeline], epochs=1)
    span = {(i.step, i.microbatch, i.stage, i.phase): i for i in timeline.intervals}
    assert len(span) == 2 * 4 * 2 * 2
    for step in (1, 2):
        for stage in (0, 1):
            for m in range(2 - stage, 4):
                waited = span[step, m - (2 - stage), stage, "backward"]
                assert span[step, m, stage, "forward"].start >= waited.end, (step, stage, m)


def test_pipelined_step_computes_each_dense_weight_gradient_once():
    """M microbatches on 2 stages: one weight-gradient MatMul per Dense layer, not M, and
    each on its layer's stage (weight_gradient_split; upstream builds M, see
    test_compat_upstream.py::test_upstream_tapes_build_a_weight_gradient_per_microbatch)."""
    import inspect

    config = {"data_parallel": {"mode": "none"},
              "model_parallel": {"stages": 2, "microbatches": 4,
                                 "placement": {"^first$": 0, "^second$": 1}}}
    with hybridpar.scope(config):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="first"),
                                  keras.layers.Dense(4, name="second")])
        model.compile(optimizer="sgd", loss="mse")
    x = np.ones((16, 8), "float32")
    model.fit(x, np.ones((16, 4), "float32"), batch_size=16, epochs=1, verbose=0)
    traced = inspect.getclosurevars(model.train_function).nonlocals["traced"]
    graph = traced._list_all_concrete_functions()[0].graph.as_graph_def()
    nodes = [n for f in graph.library.function for n in f.node_def] + list(graph.node)
    weight_products = [n for n in nodes if n.op == "MatMul" and n.attr["transpose_a"].b]
    assert sorted(n.device[-5:] for n in weight_products) == ["CPU:0", "CPU:1"]

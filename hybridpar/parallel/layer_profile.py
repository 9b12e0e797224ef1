"""``placement: {auto: profile}``: each unit's measured forward and backward time on one device.

Each unit runs alone on the first local device, on inputs of its first use's
shapes (``batch`` examples, unknown dimensions as ``layer_costs.UNKNOWN_DIM``;
float inputs random, integer inputs zero, booleans true), in a
``tf.function`` that computes its outputs and the gradients of their sum
with respect to its trainable weights and float inputs (see ``measure``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hybridpar.parallel.layer_costs import UNKNOWN_DIM, ModelUnit


def _concrete(tensor: Any, batch: int, rng: np.random.Generator) -> tf.Tensor:
    shape = [batch, *(UNKNOWN_DIM if d is None else d for d in tuple(tensor.shape)[1:])]
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if "float" in dtype:
        return tf.constant(rng.standard_normal(shape).astype(dtype))
    if dtype == "bool":
        return tf.ones(shape, tf.bool)
    return tf.zeros(shape, dtype)


def _step(layer: Any, node: Any, batch: int, rng: np.random.Generator) -> tuple[Any, list]:
    """A traced forward+backward of one use of ``layer``, and its inputs."""
    inputs = [_concrete(t, batch, rng) for t in node.arguments.keras_tensors]
    keys = [id(t) for t in node.arguments.keras_tensors]

    @tf.function
    def step(*values: tf.Tensor) -> Any:
        floats = [v for v in values if v.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(floats)
            args, kwargs = node.arguments.fill_in(dict(zip(keys, values, strict=True)))
            outputs = layer(*args, **kwargs)
            total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32))
                              for o in tf.nest.flatten(outputs)])
        return tape.gradient(total, [*layer.trainable_weights, *floats])

    return step, inputs


def _timed(step: Any, inputs: list) -> float:
    start = time.perf_counter()
    tf.nest.map_structure(lambda g: g is not None and g.numpy(), step(*inputs))
    return time.perf_counter() - start


def _baseline(inputs: list) -> Any:
    """A ``tf.function`` that only touches ``inputs``: the cost of a call, not of a layer."""

    @tf.function
    def step(*values: tf.Tensor) -> Any:
        return [tf.reduce_sum(tf.cast(v, tf.float32)) for v in values]

    return step


def measure(units: list[ModelUnit], batch: int, repeats: int = 3, seed: int = 0) -> list[float]:
    """Each unit's seconds (all its uses), on the first local device.

    The timed calls go round the units ``repeats`` times, so that a burst of
    other load on the machine slows one call of a unit rather than all of
    them, and each unit keeps its fastest call, less the fastest call of a
    function that only reads the same inputs (the per-call dispatch, which
    a training step traced as one graph does not pay per layer).
    """
    rng = np.random.default_rng(seed)
    device = tf.config.list_logical_devices()[0].name
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # one function per layer: TF warns of "retracing"
    try:
        best, calls = _time_rounds(units, batch, repeats, rng, device)
    finally:
        tf_logger.setLevel(level)
    totals = [0.0] * len(units)
    for (index, *_), (layer_time, call_time) in zip(calls, best, strict=True):
        totals[index] += max(layer_time - call_time, 0.0)
    return totals


def _time_rounds(units: list[ModelUnit], batch: int, repeats: int, rng: np.random.Generator,
                 device: str) -> tuple[list[list[float]], list[tuple]]:
    """The fastest (layer, dispatch-only) call of each use over the rounds."""
    with tf.device(device):
        calls = [(index, *_step(unit.layer, node, batch, rng))
                 for index, unit in enumerate(units) for _, node in unit.uses
                 if node is not None]
        calls = [(index, step, inputs, _baseline(inputs)) for index, step, inputs in calls]
        best = [[float("inf"), float("inf")] for _ in calls]
        for _ in range(repeats + 1):  # the first round traces and warms up
            for slot, (_, step, inputs, baseline) in zip(best, calls, strict=True):
                slot[0] = min(slot[0], _timed(step, inputs))
                slot[1] = min(slot[1], _timed(baseline, inputs))
    return best, calls

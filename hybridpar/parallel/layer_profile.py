"""``placement: {auto: profile}``: each unit's measured forward and backward time on one device.

Each unit runs alone on the first local device, on inputs of its first use's
shapes (``batch`` examples, unknown dimensions as ``layer_costs.UNKNOWN_DIM``;
float inputs random, integer inputs zero, booleans true), in a
``tf.function`` that computes its outputs and the gradients of their sum
with respect to its trainable weights and float inputs. After one warm-up
call the fastest of ``repeats`` timed calls is its cost, in seconds.
"""

from __future__ import annotations

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


def seconds(unit: ModelUnit, batch: int, repeats: int = 3, seed: int = 0) -> float:
    """The fastest of ``repeats`` forward+backward passes of ``unit``, all its uses."""
    rng = np.random.default_rng(seed)
    total = 0.0
    for _, node in unit.uses:
        if node is None:
            return 0.0
        step, inputs = _step(unit.layer, node, batch, rng)
        step(*inputs)  # trace and warm up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            tf.nest.map_structure(lambda g: g is not None and g.numpy(), step(*inputs))
            best = min(best, time.perf_counter() - start)
        total += best
    return total


def measure(units: list[ModelUnit], batch: int, repeats: int = 3) -> list[float]:
    """Each unit's seconds, measured on the first local device outside any strategy's replica."""
    device = tf.config.list_logical_devices()[0].name
    with tf.device(device):
        return [seconds(unit, batch, repeats) for unit in units]

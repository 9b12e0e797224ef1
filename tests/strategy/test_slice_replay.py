"""Elementwise ops between split layers replayed per shard (``hybridpar.parallel.slice_replay``).

On logical CPUs: two column slices are joined (``tensor_calls.joined``), the gated MLP's
``silu(gate) * up`` is applied to the joined tensors, and ``slices_of`` hands the row layer
each shard's slice made on that shard's device from that shard's slices only.
"""

import numpy as np
import pytest
import tensorflow as tf

from hybridpar.parallel import tensor_calls

pytestmark = pytest.mark.strategy

DEVICES = ("/device:CPU:0", "/device:CPU:1")


def place(shard: int):
    return tf.device(DEVICES[shard])


def ancestors(tensor: tf.Tensor) -> set[str]:
    """The names of the ops ``tensor`` is computed from."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name not in seen:
            seen.add(op.name)
            stack.extend(source.op for source in op.inputs)
    return seen


def test_silu_gated_product_is_replayed_on_each_shard_from_its_slices():
    gate = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    up = np.random.default_rng(1).normal(size=(2, 3, 8)).astype("float32")
    graph_checks = {}

    @tf.function
    def step(gate, up):
        gates = [tf.identity(part, name=f"gate_{i}") for i, part in enumerate(tf.split(gate, 2, 2))]
        ups = [tf.identity(part, name=f"up_{i}") for i, part in enumerate(tf.split(up, 2, 2))]
        product = tf.nn.silu(tensor_calls.joined(gates, 2)) * tensor_calls.joined(ups, 2)
        parts = tensor_calls.slices_of(product, -1, 2, place)
        graph_checks["sources"] = [ancestors(part) for part in parts]
        graph_checks["devices"] = [part.device for part in parts]
        return parts

    first, second = step(gate, up)
    whole = tf.nn.silu(gate) * up
    np.testing.assert_allclose(np.concatenate([first, second], -1), whole, rtol=1e-6)
    assert "gate_1" not in graph_checks["sources"][0] and "up_1" not in graph_checks["sources"][0]
    assert {"gate_1", "up_1"} <= graph_checks["sources"][1]
    assert [tf.DeviceSpec.from_string(d).device_index for d in graph_checks["devices"]] == [0, 1]


def test_an_input_not_made_from_slices_is_split_where_it_is():
    @tf.function
    def step(x):
        parts = tensor_calls.slices_of(tf.nn.softmax(x), -1, 2, place)  # softmax spans the axis
        assert all(part.op.type == "Split" for part in parts)
        return parts

    step(tf.ones([2, 8]))

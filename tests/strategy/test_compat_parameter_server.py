"""The parameter-server fixes in hybridpar.compat: upstream behaviour, then the fix.

Upstream is reproduced in a fresh process without hybridpar
(tests/strategy/upstream_ps.py); the fixes are checked here on the same kind
of ``ShardedVariable`` a ParameterServerStrategy builds, with shards that
belong to a strategy hybridpar built (the fixes act on no other). Real
clusters are in tests/multiworker/test_parameter_server.py.
"""

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
import upstream_ps  # beside this file; pytest puts its folder on sys.path
from upstream_runner import run_case  # beside this file

import hybridpar
from hybridpar import compat
from hybridpar.compat.atomic_updates import atomic_updates
from hybridpar.compat.shard_views import shard_views

pytestmark = pytest.mark.strategy

UPSTREAM = pathlib.Path(__file__).with_name("upstream_ps.py")


def run_upstream(case: str) -> dict:
    return run_case(UPSTREAM, case)


@pytest.fixture(autouse=True)
def fixes_installed():
    with compat.holding("parameter_server"), compat.holding("split_weights"):
        yield


@pytest.fixture(scope="module")
def owned():
    """A strategy hybridpar built, owning the shards of ``sharded_embedding(owned)``."""
    with hybridpar.scope({"data_parallel": {"mode": "none"}}) as hs:
        pass
    return hs.strategy


@pytest.mark.slow
def test_upstream_embedding_concatenates_the_sharded_table():
    assert run_upstream("embedding_reads_whole_table") == {"concat": 2, "gathers": 0, "reads": 4}


@pytest.mark.slow
def test_upstream_gradient_of_a_sharded_keras_variable_fails():
    error = run_upstream("gradient_of_sharded_variable")["error"]
    assert error == "'ShardedVariable' object has no attribute 'handle'"


@pytest.mark.slow
def test_upstream_sharded_keras_variable_cannot_be_saved():
    error = run_upstream("sharded_variable_as_numpy")["error"]
    assert error == "'ShardedVariable' object has no attribute '__array__'"


@pytest.mark.slow
def test_upstream_assign_add_is_a_read_then_a_write():
    ops = run_upstream("assign_add_ops")["ops"]
    assert "AssignVariableOp" in ops and "AssignAddVariableOp" not in ops


def test_embedding_gathers_only_the_looked_up_rows_shard_by_shard(owned):
    layer = upstream_ps.sharded_embedding(owned)
    graph = tf.function(layer).get_concrete_function(tf.TensorSpec([None], tf.int32)).graph
    ops = [op.type for op in graph.get_operations()]
    assert ops.count("ResourceGather") == 2  # one per shard, no whole-table read
    assert "ReadVariableOp" not in ops
    concatenated = [op.outputs[0].shape for op in graph.get_operations() if op.type == "ConcatV2"]
    assert all(shape.rank == 1 for shape in concatenated)  # shapes only, never the table
    table = np.arange(30, dtype="float32").reshape(10, 3)
    np.testing.assert_array_equal(layer(tf.constant([1, 7, 5])).numpy(), table[[1, 7, 5]])


def test_gradients_and_slots_follow_the_shards(owned):
    layer = upstream_ps.sharded_embedding(owned)
    model = keras.Sequential([keras.Input((2,), dtype="int32"), layer])
    optimizer = keras.optimizers.Adam(0.5)
    with shard_views(model):
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.constant([[1, 7]])))
        gradients = tape.gradient(loss, variables)
        optimizer.apply(gradients, variables)
    assert [type(v).__name__ for v in variables] == ["ShardView", "ShardView"]
    shards = layer.embeddings._value.variables
    assert [v.value is s for v, s in zip(variables, shards, strict=True)] == [True, True]
    assert [type(g).__name__ for g in gradients] == ["IndexedSlices", "IndexedSlices"]
    assert [g.indices.numpy().tolist() for g in gradients] == [[1], [2]]  # row 7 = shard 1 row 2
    assert [v.shape for v in optimizer.variables if "momentum" in v.path] == [(5, 3), (5, 3)]
    before = np.arange(30, dtype="float32").reshape(10, 3)
    changed = np.any(np.asarray(layer.embeddings) != before, axis=1)
    assert np.flatnonzero(changed).tolist() == [1, 7]
    assert model.trainable_variables == [layer.embeddings]  # outside the block: unchanged


def test_atomic_updates_add_in_one_op():
    variable = keras.Variable(0.0)

    def add():
        with atomic_updates():
            return variable.assign_add(1.0)

    ops = upstream_ps.op_types(add)
    assert "AssignAddVariableOp" in ops and "AssignVariableOp" not in ops
    tf.function(add)()
    assert float(variable.numpy()) == 1.0
    assert "AssignAddVariableOp" not in upstream_ps.op_types(lambda: variable.assign_add(1.0))


def test_sharded_keras_variable_reads_whole_for_saving(owned, tmp_path):
    layer = upstream_ps.sharded_embedding(owned)
    table = np.arange(30, dtype="float32").reshape(10, 3)
    np.testing.assert_array_equal(np.asarray(layer.embeddings), table)
    np.testing.assert_array_equal(layer.embeddings.numpy(), table)
    model = keras.Sequential([keras.Input((2,), dtype="int32"), layer])
    model.save_weights(tmp_path / "sharded.weights.h5")
    plain = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(10, 3)])
    plain.load_weights(tmp_path / "sharded.weights.h5")
    np.testing.assert_array_equal(plain.layers[0].embeddings.numpy(), table)


def test_sharded_variables_of_other_strategies_keep_the_upstream_path():
    layer = upstream_ps.sharded_embedding()  # shards of the default strategy
    ops = upstream_ps.op_types(layer, tf.TensorSpec([None], tf.int32))
    assert (ops.count("ConcatV2"), ops.count("ResourceGather")) == (2, 0)
    with pytest.raises(AttributeError, match="__array__"):
        np.asarray(layer.embeddings)

"""Reproduces upstream Keras behaviours with sharded variables WITHOUT hybridpar.

A ParameterServerStrategy with a variable partitioner gives a Keras variable a
``tf.distribute`` ``ShardedVariable`` as its value (the
cluster tests check that on real ps tasks). Here the same object is built
directly, in a fresh process, so none of hybridpar's fixes are installed.
Each case prints one JSON line (see tests/strategy/test_compat_parameter_server.py).

    python upstream_ps.py CASE
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

ROWS, DIM = 10, 3


def sharded_embedding(strategy: tf.distribute.Strategy | None = None) -> keras.layers.Embedding:
    """An Embedding whose table is a ShardedVariable of two shards (5 rows each).

    The shards belong to ``strategy`` (default: none), as a parameter-server
    strategy's shards belong to it.
    """
    with (strategy or tf.distribute.get_strategy()).scope():
        layer = keras.layers.Embedding(ROWS, DIM)
        layer.build((None,))
        table = np.arange(ROWS * DIM, dtype="float32").reshape(ROWS, DIM)
        shards = [tf.Variable(table[:5]), tf.Variable(table[5:])]
    layer._embeddings._value = sharded_variable.ShardedVariable(shards)
    return layer


def op_types(function, *args) -> list[str]:
    graph = tf.function(function).get_concrete_function(*args).graph
    return sorted(op.type for op in graph.get_operations())


def embedding_reads_whole_table() -> dict:
    """Embedding.call on a sharded table: which ops run."""
    layer = sharded_embedding()
    ops = op_types(layer, tf.TensorSpec([None], tf.int32))
    return {"concat": ops.count("ConcatV2"), "gathers": ops.count("ResourceGather"),
            "reads": ops.count("ReadVariableOp")}


def gradient_of_sharded_variable() -> dict:
    """tape.gradient against a Keras variable holding a ShardedVariable."""
    layer = sharded_embedding()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([1, 7])))
    try:
        tape.gradient(loss, layer.trainable_variables)
        return {"error": None}
    except AttributeError as err:
        return {"error": str(err)}


def sharded_variable_as_numpy() -> dict:
    """np.asarray of a Keras variable holding a ShardedVariable (what saving does)."""
    try:
        np.asarray(sharded_embedding().embeddings)
        return {"error": None}
    except AttributeError as err:
        return {"error": str(err)}


def assign_add_ops() -> dict:
    """The ops of keras.Variable.assign_add."""
    variable = keras.Variable(0.0)
    return {"ops": sorted(set(op_types(lambda: variable.assign_add(1.0))))}


CASES = {
    f.__name__: f
    for f in (embedding_reads_whole_table, gradient_of_sharded_variable,
              sharded_variable_as_numpy, assign_add_ops)
}

if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]]()), flush=True)

"""A Keras ``Embedding`` over a sharded table gathers only the rows it looks up.

Upstream (Keras 3.15, ``Embedding.call``): ``ops.take(self.embeddings, ids)``
converts the whole table to one tensor first; for a ``ShardedVariable`` that
concatenates every shard, so the full table crosses the network each step.
``tf.nn.embedding_lookup`` on a ``ShardedVariable`` gathers only the
looked-up rows from each shard, and its gradient is sparse. Applied to
tables a hybridpar parameter-server strategy built; installed only while
one is alive.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.compat.shard_views import sharded
from hybridpar.state import state_of


def _owned_table(self, *args, **kwargs) -> bool:
    table = sharded(getattr(self, "_embeddings", None))
    return (table is not None and state_of(table._distribute_strategy) is not None
            and not getattr(self, "lora_enabled", False) and not self.quantization_mode)


def _shard_by_shard(original: Any) -> Any:
    def call(self, inputs):
        table = sharded(self._embeddings)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        return tf.cast(tf.nn.embedding_lookup(table, inputs), self.compute_dtype)

    return call


FIX = register(Fix(
    name="sharded_embedding",
    corrects="Embedding reads every shard of a sharded table and concatenates them each step",
    group="parameter_server",
    patches=(Patch(keras.layers.Embedding, "call", _shard_by_shard,
                     owns=_owned_table),),
))

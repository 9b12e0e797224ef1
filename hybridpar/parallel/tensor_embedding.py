"""Megatron's vocabulary-split compute for the token embeddings a tensor plan splits.

A token embedding ``[vocabulary, d]`` split on its vocabulary holds rows
``[t * V/T, (t + 1) * V/T)`` on device ``t`` of its group. Read whole, the
table would be gathered onto the leader every step; instead the layer's
instance ``call`` (the class is untouched) computes on the shards:

- forward (token ids to vectors): each device looks up the ids that fall in
  its rows (the others give zero vectors), and the leader sums the ``T``
  lookups. Exactly one addend of each sum is non-zero, so the result equals
  one device's bit for bit, and each shard's gradient is the ``IndexedSlices``
  of its own rows, built on its device;
- reverse (keras ``ReversibleEmbedding(reverse=True)``, a tied or untied
  output projection): each device computes the logits of its vocabulary
  slice, and the slices are joined on the leader for the loss (the
  cross-entropy is not split: Megatron's parallel softmax would need the loss
  inside the model).

Each shard's ops open the ``hybridpar_stage<k>_shard<t>`` scope, as the
other split calls do (``tensor_calls``), so their gradients stay on the
shard's device. Outside a hybridpar replica the original call runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend import set_keras_mask

from hybridpar.parallel.split_variable import SplitVariable
from hybridpar.parallel.tensor_calls import joined, on_shard, running_state, shard_reads


def _split_on(variable: Any, axis: int) -> bool:
    value = getattr(variable, "_value", None)
    return isinstance(value, SplitVariable) and value.axis == axis


def splits_vocabulary(layer: Any) -> bool:
    """Whether ``layer`` is a keras ``Embedding`` whose table is stored split on its rows."""
    if not isinstance(layer, keras.layers.Embedding):
        return False
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return False
    if not _split_on(getattr(layer, "_embeddings", None), 0):
        return False
    if isinstance(layer, keras.layers.ReversibleEmbedding) and not layer.tie_weights:
        return _split_on(getattr(layer, "reverse_embeddings", None), 1)
    return True


def _lookup(state: Any, stage: int, tables: list[tf.Tensor], ids: tf.Tensor) -> tf.Tensor:
    rows = int(tables[0].shape[0])
    found = []
    for shard, table in enumerate(tables):
        with on_shard(state, stage, shard):
            local = ids - shard * rows
            inside = tf.logical_and(local >= 0, local < rows)
            vectors = tf.gather(table, tf.where(inside, local, tf.zeros_like(local)))
            found.append(vectors * tf.cast(inside, vectors.dtype)[..., None])
    return tf.add_n(found)


def _logits(layer: Any, state: Any, stage: int, inputs: Any) -> tf.Tensor:
    dtype = layer.reverse_dtype or layer.compute_dtype
    tied = layer.tie_weights  # rows of the table are the logits' columns: transpose_b
    kernels = shard_reads(layer._embeddings if tied else layer.reverse_embeddings, dtype)
    inputs = tf.cast(inputs, dtype)
    parts = []
    for shard, kernel in enumerate(kernels):
        with on_shard(state, stage, shard):
            logits = tf.matmul(inputs, kernel, transpose_b=tied)
            if layer.logit_soft_cap is not None:
                logits = tf.tanh(logits / layer.logit_soft_cap) * layer.logit_soft_cap
            parts.append(logits)
    return joined(parts, -1)


def embedding_call(layer: Any, stage: int, original: Callable[..., Any]) -> Callable[..., Any]:
    """The vocabulary-split ``call`` of ``layer`` (``original`` outside a hybridpar replica)."""
    reversible = isinstance(layer, keras.layers.ReversibleEmbedding)

    @functools.wraps(original)
    def call(inputs, *args, **kwargs):
        state = running_state(stage)
        if state is None:
            return original(inputs, *args, **kwargs)
        if reversible and kwargs.get("reverse", args[0] if args else False):
            return _logits(layer, state, stage, inputs)
        ids = tf.convert_to_tensor(inputs)
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int32)
        vectors = _lookup(state, stage, shard_reads(layer._embeddings, layer.compute_dtype),
                          ids)
        if reversible and layer.mask_zero:  # ReversibleEmbedding masks in its call
            set_keras_mask(vectors, keras.layers.Embedding.compute_mask(layer, ids))
        return vectors

    return call


def install(model: Any, stage_of: Callable[[Any], int]) -> int:
    """Replaces the calls of ``model``'s vocabulary-split embeddings by their split compute.

    Args:
        model: a model whose weights are split.
        stage_of: the stage of a variable.

    Returns:
        How many calls were replaced.
    """
    replaced = 0
    for layer in model._flatten_layers():
        if splits_vocabulary(layer) and "call" not in vars(layer):
            stage = stage_of(layer._embeddings._value.variables[0])
            object.__setattr__(layer, "call", embedding_call(layer, stage, layer.call))
            replaced += 1
    return replaced

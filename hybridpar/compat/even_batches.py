"""Global batches split evenly over the replicas of hybridpar's mirrored strategies.

Upstream (TF 2.21, ``input_lib._make_rebatch_fn``): when TensorFlow can read
a batch size from the dataset graph (file-based pipelines), it rebatches
front-first, so a final partial batch of 92 examples over 4 replicas becomes
32, 32, 28 and 0. An empty replica is harmful: oneDNN's fused Conv2D returns
a wrongly shaped tensor for an empty batch ("input depth must be evenly
divisible by filter depth: 1 vs 32") and batch statistics of zero examples
are NaN. ``distribute_evenly`` splits every global batch evenly (23, 23, 23,
23) with TensorFlow's own even-split rebatch op, the one it uses when it
cannot read a batch size. Datasets whose batches have one static size that
divides over the replicas (``drop_remainder``) are already even and pass
unchanged, keeping their static shapes. Only a final batch with fewer
examples than replicas still leaves replicas empty; no example is dropped.
Keras's ``model.fit`` calls ``experimental_distribute_dataset`` on the
strategy, so overriding it in hybridpar's strategy class covers every
fit/evaluate/predict without touching Keras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as distribute_ops

from hybridpar.compat.patching import Fix, register
from hybridpar.data import inspect

FIX = register(Fix(
    name="even_batches",
    corrects="file-based batches are split front-first over replicas, leaving some empty",
    group="core",
))


def distribute_evenly(
    strategy: tf.distribute.Strategy,
    dataset: Any,
    options: Any,
    distribute: Callable[[Any, Any], Any],
) -> Any:
    """``distribute(dataset, options)``, with uneven batches split evenly first.

    Args:
        strategy: the strategy the dataset is distributed over.
        dataset: what ``experimental_distribute_dataset`` received.
        options: its ``tf.distribute.InputOptions``.
        distribute: the strategy's own ``experimental_distribute_dataset``.
    """
    replicas = strategy.num_replicas_in_sync
    if replicas == 1 or not isinstance(dataset, tf.data.Dataset):
        return distribute(dataset, options)
    size = inspect.static_batch_size(dataset)
    if not inspect.is_batched(dataset) or (size is not None and size % replicas == 0):
        return distribute(dataset, options)
    per_replica = distribute_ops._LegacyRebatchDataset(dataset, replicas)
    return strategy.distribute_datasets_from_function(lambda _: per_replica, options)

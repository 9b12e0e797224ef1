"""Global batches split over the replicas in balanced pieces, never an empty one.

Upstream (TF 2.21, ``input_lib._make_rebatch_fn``): a global batch is split
over the replicas front-first when TensorFlow can read a batch size from the
dataset graph (file-based pipelines: a final batch of 92 over 4 replicas
becomes 32, 32, 28, 0) and with the per-replica size rounded up otherwise
(``_LegacyRebatchDataset``: 6 examples become 2, 2, 2, 0, and 2 become 1, 1,
0, 0). An empty replica is harmful: oneDNN's fused Conv2D returns a wrongly
shaped tensor for an empty batch (``keras.applications.MobileNetV2`` fails
in ``fit``, ``evaluate`` and ``predict`` with "Incompatible shapes: [16] vs.
[3]"), and the batch statistics of zero examples are NaN, which the gradient
all-reduce spreads into every copy of a batch-norm layer.

hybridpar's replicated strategies distribute ``hybridpar.data.balanced``
pieces instead: per-replica sizes differ by at most one, and a batch with
fewer examples than replicas is padded with copies that carry a keep of 0,
so they add nothing to the loss, the metrics, the gradients or ``predict``'s
rows (``replica_share``, ``padded_steps``). Datasets whose batches have one
static size that divides over the replicas (``drop_remainder``) are already
even and pass unchanged, keeping their static shapes. Keras's ``model.fit``
calls ``experimental_distribute_dataset`` on the strategy, so overriding it
in hybridpar's strategy classes covers every fit/evaluate/predict without
touching Keras.

``fit``'s training input, when a checkpoint saves it, gets the same pieces
read from one iterator per worker instead (``distribute_resumably``,
``hybridpar.data.resumable``): TensorFlow's distributed iterator cannot be
saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import input_ops

from hybridpar.data import balanced, inspect, resumable


@dataclasses.dataclass(frozen=True)
class WorkerInput:
    """How one worker of a multi-worker strategy reads the global batches.

    Attributes:
        worker_id: the worker's position (its replicas are the ``worker_id``-th
            group of the strategy's replicas).
        num_workers: the training workers.
        policy: the resolved ``data.shard_policy``: ``data`` (every worker reads
            every batch and keeps its replicas' pieces), ``file`` (each worker
            reads its own files) or ``off`` (each worker reads everything).
    """

    worker_id: int
    num_workers: int
    policy: str


def needs_split(dataset: Any, replicas: int) -> bool:
    """True for a batched dataset whose batches may not divide evenly over ``replicas``."""
    if replicas == 1 or not isinstance(dataset, tf.data.Dataset):
        return False
    if not inspect.is_batched(dataset):
        return False
    size = inspect.static_batch_size(dataset)
    return size is None or size % replicas != 0


def _pieces(dataset: tf.data.Dataset, replicas: int, worker: WorkerInput | None) -> Any:
    if worker is None:
        return balanced.split_batches(dataset, replicas)
    local = replicas // worker.num_workers
    if worker.policy == "data":
        return balanced.split_batches(dataset, replicas, worker.worker_id * local, local)
    own = input_ops.auto_shard_dataset(dataset, worker.num_workers, worker.worker_id, replicas)
    return balanced.split_batches(own, replicas)


def _own_pieces(dataset: tf.data.Dataset, replicas: int,
                worker: WorkerInput | None) -> tuple[tf.data.Dataset, int]:
    """This worker's pieces of every global batch, and how many of them feed one step.

    The pieces ``distribute_evenly`` distributes: balanced ones where batches may not
    divide over the replicas, else equal slices with their static shapes (as
    TensorFlow's rebatching gives them).
    """
    if replicas == 1:
        return dataset, 1
    local = replicas if worker is None else replicas // worker.num_workers
    if needs_split(dataset, replicas):
        return _pieces(dataset, replicas, worker), local
    per_piece = inspect.static_batch_size(dataset) // replicas
    if worker is None:
        return balanced.split_evenly(dataset, per_piece, 0, replicas), local
    if worker.policy == "data":
        return balanced.split_evenly(dataset, per_piece, worker.worker_id * local, local), local
    own = input_ops.auto_shard_dataset(dataset, worker.num_workers, worker.worker_id, replicas)
    return balanced.split_evenly(own, per_piece, 0, replicas), local


def distribute_resumably(
    strategy: Any, dataset: Any, worker: WorkerInput | None = None
) -> resumable.ResumableDataset | None:
    """``dataset`` as ``fit``'s resumable training input (``hybridpar.data.resumable``): the
    pieces ``distribute_evenly`` gives each replica, read from one iterator per worker.

    Returns:
        ``None`` unless ``dataset`` is the training input of a ``fit`` whose checkpoints save
        it (the strategy's trainer says so while Keras's epoch iterator distributes it) and
        a dataset of batches: it is then distributed as usual.
    """
    trainer = strategy.hybridpar_state.trainer
    if not getattr(trainer, "distributing_resumable_input", False):
        return None
    replicas = strategy.num_replicas_in_sync
    if not isinstance(dataset, tf.data.Dataset) or (
            replicas > 1 and not inspect.is_batched(dataset)):
        return None
    pieces, local = _own_pieces(dataset, replicas, worker)
    workers = 1 if worker is None else worker.num_workers
    policy = "data" if worker is None else worker.policy
    # As TensorFlow's distributed iterator does over workers (whose collectives the steps of
    # workers reading another way then match): agree on the end unless the input is endless.
    endless = int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
    layout = resumable.InputLayout(local, agree=workers > 1 and not endless,
                                   whole=workers == 1 or policy != "file")
    # The fingerprint names how the pieces are cut; the dataset's structural digest
    # (``ResumableDataset.digest``) names the pipeline they are cut from.
    fingerprint = (f"{workers} worker(s) x {local} replica(s), {policy} sharding, pieces "
                   f"{pieces.element_spec}")
    return resumable.ResumableDataset(strategy, pieces, layout, fingerprint, source=dataset)


def distribute_evenly(
    strategy: tf.distribute.Strategy,
    dataset: Any,
    options: Any,
    distribute: Callable[[Any, Any], Any],
    worker: WorkerInput | None = None,
) -> Any:
    """``distribute(dataset, options)``, with uneven batches split in balanced pieces first.

    Args:
        strategy: the strategy the dataset is distributed over.
        dataset: what ``experimental_distribute_dataset`` received (for a
            multi-worker strategy, with its auto-shard option set).
        options: its ``tf.distribute.InputOptions``.
        distribute: the strategy's own ``experimental_distribute_dataset``.
        worker: this worker's part of a multi-worker strategy's input.
    """
    replicas = strategy.num_replicas_in_sync
    if not needs_split(dataset, replicas):
        return distribute(dataset, options)
    return strategy.distribute_datasets_from_function(
        lambda _: _pieces(dataset, replicas, worker), options
    )

"""Restoring a model on every worker of a multi-worker strategy, each reading its share.

Every worker restores every replicated variable of the checkpoint the chief
chose (``coordination``). Each reads only its share of them (``read_shares``:
about ``1/workers`` of the bytes) and the workers exchange the rest: one SUM
all-reduce, through the strategy's collectives, of each run of variables
(``CHUNK_BYTES`` at a time), to which a worker gives the values it read and
zeros for the others (on its first replica; its other replicas give zeros).
Storage then serves the checkpoint once per restart, not once per worker,
and each worker's reads run at the same time. The values assigned are those
a full read would assign: a sum of one value and zeros is that value.
Variables of a dtype the collectives do not sum, and parts that are not
whole variables (a worker's ZeRO shards, its PowerSGD rows), are read as
before, by whoever holds them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hybridpar.checkpoint import read_shares, tensor_io
from hybridpar.checkpoint.layout import Logical, Part
from hybridpar.parallel import all_reduce

logger = logging.getLogger("hybridpar")

CHUNK_BYTES = 256 * 2**20  # what one exchange holds on a worker, besides its result

Item = tuple[str, Logical, Any]  # (tensor key, logical tensor, part)


def _shared(item: Item) -> bool:
    _, logical, part = item
    return (isinstance(part, Part) and part.offset is None
            and logical.dtype in read_shares.COLLECTIVE_DTYPES)


def restore(strategy: tf.distribute.Strategy, items: Sequence[Item], values: Any,
            worker: int, workers: int) -> list[Item]:
    """Assigns the shared ``items`` with every worker reading its share (module doc).

    Every worker must call this with the same items, in the same order.

    Args:
        items: ``(key, logical, part)`` of every part to restore, in the checkpoint's order.
        values: the checkpoint's reader.
        worker: this worker's position; ``workers``: how many there are.

    Returns:
        The items it left to the caller (each read by the task that holds it).
    """
    shared = [item for item in items if _shared(item)]
    sizes = [read_shares.nbytes(item[1].shape, item[1].dtype) for item in shared]
    owner = read_shares.owners(sizes, workers)
    local = strategy.num_replicas_in_sync // workers
    read = 0
    for run in read_shares.chunks(sizes, CHUNK_BYTES):
        tensors = []
        for index in run:
            name, logical, part = shared[index]
            if owner[index] == worker:
                tensors.append(tf.convert_to_tensor(values.read(name, logical, part),
                                                    logical.dtype))
                read += sizes[index]
            else:
                tensors.append(tf.zeros(logical.shape, logical.dtype))
        for index, value in zip(run, _exchange(strategy, tensors, local), strict=True):
            tensor_io.assign(shared[index][2], value)
    logger.info("hybridpar: worker %d of %d read %s of the checkpoint's %s bytes of "
                "replicated variables and received the rest from the other workers.", worker,
                workers, f"{read:,}", f"{sum(sizes):,}")
    return [item for item in items if not _shared(item)]


def _exchange(strategy: tf.distribute.Strategy, tensors: list[tf.Tensor],
              local: int) -> list[tf.Tensor]:
    """The SUM over the workers of ``tensors`` (each worker's first replica's), on this one."""
    if not tensors:
        return []

    def replica(*values: tf.Tensor) -> list[Any]:
        context = tf.distribute.get_replica_context()
        first = context.replica_id_in_sync_group % local == 0
        return all_reduce.all_reduce_sum([tf.where(first, v, tf.zeros_like(v)) for v in values])

    results = strategy.run(replica, args=tuple(tensors))
    return [strategy.experimental_local_results(result)[0] for result in results]


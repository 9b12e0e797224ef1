"""Global batches split into balanced per-replica pieces, none of them empty.

Each global batch of ``n`` examples becomes ``pieces`` consecutive slices whose
sizes differ by at most one (the larger ones first). A batch with fewer
examples than pieces is first padded to one example per piece with copies of
its first example, which carry a ``keep`` of 0 (the input's own examples carry
1): a replica never receives an empty batch, and whoever consumes the pieces
can give the padding no weight. Each piece is a ``ReplicaBatch``.

``split_batches`` is what hybridpar's replicated strategies distribute in
place of the user's dataset (``strategies.even_batches``); ``split_evenly``
cuts batches that divide into equal slices with static shapes, for the
resumable input (``resumable``), which reads the pieces itself;
``zero_row_if_empty`` guards the one case the split cannot see, a replica
that a distributed iterator hands an empty batch because its worker's input
ended before another worker's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf


class ReplicaBatch(NamedTuple):
    """One replica's piece of a global batch.

    Attributes:
        data: the piece, in the structure the dataset yields.
        keep: float32 of shape ``[piece size]``: 1.0 for the input's
            examples, 0.0 for padding.
    """

    data: Any
    keep: tf.Tensor


def _first_tensor(structure: Any) -> Any:
    return next(t for t in tf.nest.flatten(structure, expand_composites=False) if t is not None)


def _leading_size(tensor: Any) -> tf.Tensor:
    if isinstance(tensor, tf.RaggedTensor):
        return tensor.nrows(out_type=tf.int32)
    return tf.shape(tensor, out_type=tf.int32)[0]


def _take_rows(structure: Any, indices: tf.Tensor) -> Any:
    return tf.nest.map_structure(
        lambda t: None if t is None else tf.gather(t, indices), structure
    )


def padded_to(batch: Any, rows: int) -> tuple[Any, tf.Tensor]:
    """``batch`` with copies of its first example appended up to ``rows`` examples, and
    its keep mask (1.0 for the batch's own examples, 0.0 for the copies)."""
    size = _leading_size(_first_tensor(batch))
    padding = tf.maximum(rows - size, 0)
    keep = tf.concat([tf.ones([size]), tf.zeros([padding])], 0)

    tensors = [t for t in tf.nest.flatten(batch) if t is not None]

    def pad() -> list[Any]:
        rows = tf.concat([tf.range(size), tf.zeros([padding], tf.int32)], 0)
        return [tf.gather(t, rows) for t in tensors]

    padded = iter(tf.cond(padding > 0, pad, lambda: [tf.identity(t) for t in tensors]))
    structure = [None if t is None else next(padded) for t in tf.nest.flatten(batch)]
    return tf.nest.pack_sequence_as(batch, structure), keep


def piece_sizes(size: tf.Tensor, pieces: int) -> tf.Tensor:
    """Sizes of ``pieces`` consecutive slices of ``size`` examples, differing by at most one."""
    base, extra = size // pieces, size % pieces
    return base + tf.cast(tf.range(pieces) < extra, size.dtype)


def split_batches(dataset: tf.data.Dataset, pieces: int, first: int = 0,
                  count: int | None = None) -> tf.data.Dataset:
    """Each global batch of ``dataset`` as ``count`` of its ``pieces`` balanced pieces.

    Args:
        dataset: a dataset of batches (every component batched along axis 0).
        pieces: how many pieces each batch is split into (the replicas in sync).
        first: the index of the first piece this dataset yields (a worker's first
            replica).
        count: how many consecutive pieces it yields per batch (the worker's
            replicas); all of them by default.

    Returns:
        A dataset of ``ReplicaBatch``, ``count`` per global batch, in order.
    """
    count = pieces - first if count is None else count

    def split(*components: Any) -> tf.data.Dataset:
        batch = components[0] if len(components) == 1 else components
        padded, keep = padded_to(batch, pieces)
        sizes = piece_sizes(_leading_size(keep), pieces)
        starts = tf.cumsum(sizes, exclusive=True)

        def piece(index: tf.Tensor) -> ReplicaBatch:
            start, size = starts[index], sizes[index]
            rows = tf.range(start, start + size)
            return ReplicaBatch(_take_rows(padded, rows), tf.gather(keep, rows))

        return tf.data.Dataset.range(first, first + count).map(piece)

    return dataset.flat_map(split)


def split_evenly(dataset: tf.data.Dataset, per_piece: int, first: int,
                 count: int) -> tf.data.Dataset:
    """Each global batch of ``dataset`` (all of one static size, a multiple of ``per_piece``)
    as ``count`` consecutive slices of ``per_piece`` examples from slice ``first`` on, with
    their static shapes (TensorFlow's rebatching of such a batch, as a dataset).
    """

    def rows(tensor: Any, start: tf.Tensor) -> Any:
        taken = tf.gather(tensor, tf.range(start, start + per_piece))
        if isinstance(taken, tf.Tensor):
            taken = tf.ensure_shape(taken, [per_piece, *tensor.shape[1:]])
        return taken

    def split(*components: Any) -> tf.data.Dataset:
        batch = components[0] if len(components) == 1 else components

        def piece(index: tf.Tensor) -> Any:
            start = tf.cast(index, tf.int32) * per_piece
            return tf.nest.map_structure(lambda t: None if t is None else rows(t, start), batch)

        return tf.data.Dataset.range(first, first + count).map(piece)

    return dataset.flat_map(split)


def kept_rows(structure: Any, keep: tf.Tensor) -> Any:
    """The rows of every tensor of ``structure`` whose ``keep`` is not 0."""
    mask = keep > 0
    return tf.nest.map_structure(
        lambda t: None if t is None else tf.boolean_mask(t, mask), structure
    )


def zero_row_if_empty(batch: ReplicaBatch) -> ReplicaBatch:
    """``batch`` itself, or one all-zero example with keep 0 when it holds no example."""
    size = _leading_size(batch.keep)

    def zero_row() -> ReplicaBatch:
        def row(tensor: Any) -> Any:
            if isinstance(tensor, tf.RaggedTensor):
                return tf.RaggedTensor.from_row_lengths(
                    tf.zeros_like(tensor.flat_values[:0]), tf.zeros([1], tensor.row_splits.dtype)
                )
            shape = tf.concat([[1], tf.shape(tensor)[1:]], 0)
            empty = "" if tensor.dtype == tf.string else tf.zeros([], tensor.dtype)
            return tf.fill(shape, empty)

        return ReplicaBatch(tf.nest.map_structure(row, batch.data), tf.zeros([1]))

    return tf.cond(size > 0, lambda: batch, zero_row)

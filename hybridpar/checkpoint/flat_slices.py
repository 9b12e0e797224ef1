"""A flat range of a tensor's elements as the boxes TensorFlow's bundle format stores (pure).

ZeRO's shards (``parallel.zero_plan``) cut the flattened variables of a
bucket at any element, so the part of a variable's slot one replica holds is
a range ``start:start+length`` of its row-major elements. A tensor bundle
stores slices as hyper-rectangles (``shape_and_slices``: ``"4 5 0,2:-"``),
so such a range is stored as the few boxes that tile it in order: the rest
of a first partial row, the whole rows, then the beginning of a last partial
row, each cut again along the next dimension. Concatenating the boxes'
flattened values gives the range back. A rank-``k`` tensor needs at most
``2k - 1`` boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Box = tuple[tuple[int, ...], tuple[int, ...]]
"""``(offsets, lengths)`` per dimension of one hyper-rectangle."""


def boxes(shape: Sequence[int], start: int, length: int) -> list[Box] | None:
    """The boxes that tile elements ``start:start+length`` of a tensor of ``shape``, in order.

    Returns:
        ``None`` when the range is the whole tensor (stored whole, also for scalars and
        empty tensors); otherwise the boxes, each ``(offsets, lengths)``.

    Raises:
        ValueError: for a range outside the tensor.
    """
    shape = tuple(int(d) for d in shape)
    size = math.prod(shape)
    if start < 0 or length < 0 or start + length > size:
        raise ValueError(f"elements {start}:{start + length} are outside a tensor of shape "
                         f"{shape} ({size} elements).")
    if start == 0 and length == size:
        return None
    return [box for box in _tile(shape, start, start + length) if math.prod(box[1])]


def _tile(shape: tuple[int, ...], begin: int, end: int) -> list[Box]:
    """Boxes of elements ``begin:end`` (``begin < end``) of a tensor of rank >= 1."""
    if len(shape) == 1:
        return [((begin,), (end - begin,))]
    inner = math.prod(shape[1:])
    first, last = begin // inner, end // inner
    if first == last:
        return _within_row(shape, first, begin - first * inner, end - first * inner)
    found: list[Box] = []
    whole_from = first
    if begin % inner:
        found += _within_row(shape, first, begin % inner, inner)
        whole_from = first + 1
    if last > whole_from:
        found.append(((whole_from,) + (0,) * (len(shape) - 1), (last - whole_from, *shape[1:])))
    if end % inner:
        found += _within_row(shape, last, 0, end % inner)
    return found


def _within_row(shape: tuple[int, ...], row: int, begin: int, end: int) -> list[Box]:
    if begin == 0 and end == math.prod(shape[1:]):
        return [((row,) + (0,) * (len(shape) - 1), (1, *shape[1:]))]
    return [((row, *offsets), (1, *lengths)) for offsets, lengths in _tile(shape[1:], begin, end)]


def spec(shape: Sequence[int], box: Box | None) -> str:
    """TensorFlow's ``shape_and_slice`` of ``box`` of a tensor of ``shape`` (``""``: whole)."""
    if box is None:
        return ""
    dims = " ".join(str(int(d)) for d in shape)
    return f"{dims} " + ":".join(f"{o},{n}" for o, n in zip(*box, strict=True))

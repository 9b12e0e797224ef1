"""Which worker reads which variable of a checkpoint every worker restores (pure).

Under a multi-worker strategy every worker holds every replicated variable,
so without shares each would read the whole checkpoint (256 workers x 3 GB:
768 GB from storage per restart). Instead each worker reads a share of about
``1/workers`` of the bytes and the workers exchange the rest
(``shared_restore``). The shares are a function of the variables' sizes
only, so every worker computes the same ones without talking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# What TensorFlow's collectives sum: a variable of another dtype is read by every worker.
COLLECTIVE_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int32", "int64"})
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}


def nbytes(shape: Sequence[int], dtype: str) -> int:
    """The bytes of a tensor of ``shape`` and ``dtype`` (one of ``COLLECTIVE_DTYPES``)."""
    return math.prod(shape) * _DTYPE_BYTES[dtype]


def owners(sizes: Sequence[int], workers: int) -> list[int]:
    """The worker that reads each of the tensors of ``sizes`` bytes.

    The largest tensor first, each to the worker with the fewest bytes so far
    (the lowest worker on a tie): no worker reads more than its ``1/workers``
    plus the largest tensor.

    Raises:
        ValueError: for fewer than one worker.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1. Received: workers={workers}")
    loads = [0] * workers
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        owner[index] = worker
        loads[worker] += sizes[index]
    return owner


def chunks(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """The tensors' indices in order, cut into runs of at most ``limit`` bytes each (a
    tensor larger than ``limit`` alone): what one exchange holds in memory at a time."""
    runs: list[list[int]] = []
    total = limit
    for index, size in enumerate(sizes):
        if total + size > limit or not runs:
            runs.append([])
            total = 0
        runs[-1].append(index)
        total += size
    return runs

"""What gradient compression sends for each gradient, and the bytes per step (pure Python).

``communication.compression`` decides, gradient by gradient:

- ``fp16`` / ``bf16``: float32 and float64 gradients are all-reduced as 2-byte
  values; other dtypes (integers, gradients that already are 16-bit) pass
  unchanged.
- ``powersgd`` with rank ``r``: a dense floating gradient of rank >= 2 is viewed
  as an ``n x m`` matrix (``m`` = its last dimension, ``n`` = the product of
  the others, so a Dense kernel is ``inputs x units`` and a Conv2D kernel
  ``kh*kw*cin x cout``) and sent as the factors P (``n x r``) and Q
  (``m x r``), when it has at least ``min_elements`` elements and
  ``r * (n + m) < n * m``. Everything else (vectors such as biases, small
  tensors, sparse ``IndexedSlices``) goes uncompressed in the batched
  all-reduce of the P factors.

The bytes are what each replica puts into the all-reduce per step; a ring
all-reduce moves ``2 (n - 1) / n`` times that per worker, so their ratio is
also the ratio of bytes on the wire.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

LOW_ITEMSIZE = 2  # float16 and bfloat16
LOW_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True)
class GradientSpec:
    """One gradient as the plan sees it.

    Attributes:
        name: the variable's path (for messages).
        shape: the gradient's static shape.
        itemsize: bytes per element.
        floating: float32 or float64 (what fp16/bf16/PowerSGD compress).
        sparse: an ``IndexedSlices`` (rows looked up this step).
    """

    name: str
    shape: tuple[int, ...]
    itemsize: int
    floating: bool
    sparse: bool = False

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.elements * self.itemsize


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The ``n x m`` matrix PowerSGD sees a gradient of ``shape`` as (last dimension = m)."""
    return math.prod(shape[:-1]), shape[-1]


def powersgd_applies(spec: GradientSpec, rank: int, min_elements: int) -> bool:
    """Whether PowerSGD with ``rank`` compresses ``spec`` (see the module doc)."""
    if spec.sparse or not spec.floating or len(spec.shape) < 2:
        return False
    n, m = matrix_shape(spec.shape)
    return n * m >= min_elements and rank * (n + m) < n * m


@dataclasses.dataclass(frozen=True)
class Treatment:
    """How one gradient is sent: ``powersgd``, ``cast`` or ``uncompressed``, and its bytes."""

    spec: GradientSpec
    method: str
    wire_bytes: int


@dataclasses.dataclass(frozen=True)
class CompressionReport:
    """Every gradient's treatment and the bytes per step before and after compression.

    Sparse gradients' sizes depend on the rows a batch looks up, so they are
    counted but left out of the bytes.
    """

    compression: str
    rank: int | None
    treatments: tuple[Treatment, ...]

    def _dense(self, method: str | None = None) -> list[Treatment]:
        return [t for t in self.treatments
                if not t.spec.sparse and (method is None or t.method == method)]

    @property
    def bytes_before(self) -> int:
        return sum(t.spec.bytes for t in self._dense())

    @property
    def bytes_after(self) -> int:
        return sum(t.wire_bytes for t in self._dense())

    @property
    def ratio(self) -> float:
        """Bytes after / bytes before (1.0 with nothing to send)."""
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0

    def summary(self) -> str:
        """One line: what is compressed, what is not, bytes per step before and after."""
        compressed = "powersgd" if self.compression == "powersgd" else "cast"
        done, rest = self._dense(compressed), self._dense("uncompressed")
        sparse = [t for t in self.treatments if t.spec.sparse]
        if self.compression == "powersgd":
            what = (f"powersgd (rank {self.rank}): {len(done)} gradient(s) of "
                    f"{_bytes(sum(t.spec.bytes for t in done))} via PowerSGD")
        else:
            what = (f"{self.compression}: {len(done)} floating gradient(s) of "
                    f"{_bytes(sum(t.spec.bytes for t in done))} sent as "
                    f"{LOW_DTYPE_NAMES[self.compression]}")
        line = (f"gradient compression {what}, {len(rest)} uncompressed "
                f"({_bytes(sum(t.spec.bytes for t in rest))})")
        if sparse:
            line += f", {len(sparse)} sparse (uncounted)"
        return (f"{line}; {_bytes(self.bytes_before)} -> {_bytes(self.bytes_after)} per step "
                f"and replica (ratio {self.ratio:.4f})")


def _bytes(count: int) -> str:
    return f"{count:,} B"


def _treat(spec: GradientSpec, compression: str, rank: int, min_elements: int) -> Treatment:
    if compression == "powersgd" and powersgd_applies(spec, rank, min_elements):
        n, m = matrix_shape(spec.shape)
        return Treatment(spec, "powersgd", rank * (n + m) * spec.itemsize)
    if compression in LOW_DTYPE_NAMES and spec.floating and spec.itemsize > LOW_ITEMSIZE:
        return Treatment(spec, "cast", spec.elements * LOW_ITEMSIZE)
    return Treatment(spec, "uncompressed", spec.bytes)


def plan(specs: Sequence[GradientSpec], compression: str, rank: int = 4,
         min_elements: int = 0) -> CompressionReport:
    """The treatment of every gradient in ``specs`` under ``compression``.

    Args:
        specs: the gradients of one step.
        compression: ``none``, ``fp16``, ``bf16`` or ``powersgd``.
        rank: PowerSGD's rank.
        min_elements: PowerSGD leaves smaller gradients uncompressed.
    """
    return CompressionReport(
        compression=compression,
        rank=rank if compression == "powersgd" else None,
        treatments=tuple(_treat(s, compression, rank, min_elements) for s in specs),
    )

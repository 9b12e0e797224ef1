"""Which optimizer state ZeRO stage 1 shards, and how (pure Python, no TensorFlow).

``data_parallel.shard_optimizer_state: true`` gives each of ``N`` replicas
the optimizer slots of ``1/N`` of the weights. The weights are flattened and
concatenated into one bucket per (dtype, device group): a device group is
the set of devices a variable's copies live on, so every model-parallel
stage's variables form buckets of their own; a bucket holds at most
``BUCKET_ELEMENTS`` elements, unless one variable is larger. A bucket of ``n`` elements is
cut into ``N`` contiguous shards whose sizes differ by at most one element
(``n // N`` or ``n // N + 1``), each padded to ``ceil(n / N)`` so that the
collectives move equal chunks.

No tensor stays unsharded: the small-tensor threshold is 0 elements. A bias
of ten elements is ten elements of a bucket, not a tensor of its own, so
flattening costs it nothing; the only optimizer state every replica keeps
whole is each replica optimizer's scalars (its step count and learning rate).

Only optimizers whose update is element-wise can be sharded this way: the
slots of one element depend on that element's gradient and weight alone.
Options that read more than one element are refused before training (see
``check_shardable``); clipping is not among them, because Keras clips each
replica's gradients before they are summed, which sharding does not change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

from hybridpar.errors import ConfigError

THRESHOLD_ELEMENTS = 0
"""Tensors smaller than this stay unsharded: none, since buckets are flat."""

BUCKET_ELEMENTS = 2**20
"""Elements a bucket takes before the next variable opens a new one (4 MiB of float32;
a larger variable is a bucket of its own). A step copies each bucket's gradients about
three times (flat, padded chunks, received chunks) while it reduce-scatters it, and the
graph frees each gradient once its bucket is copied, so the cap bounds that transient
memory: one bucket of a whole model would hold three extra copies of every gradient."""

ELEMENT_WISE = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Lion", "Adamax", "Adadelta")
"""The Keras optimizers whose ``update_step`` is element-wise (Keras 3.15)."""

NOT_ELEMENT_WISE = {
    "Lamb": "its trust ratio divides whole-tensor norms",
    "Adafactor": "it factors each matrix's second moments into row and column statistics",
    "Muon": "it orthogonalises each whole matrix update",
    "Nadam": "it keeps one momentum-schedule product shared by all variables",
    "Ftrl": "its learning-rate power and shrinkage were not verified element by element",
}


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """What the plan needs of one trainable variable.

    Attributes:
        name: the variable's name (for messages).
        shape: its static shape.
        dtype: its dtype name.
        group: the devices its copies live on (any hashable, e.g. a tuple of names).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    group: Hashable = ()

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One flat bucket: variables of one dtype and device group, concatenated.

    Attributes:
        dtype: the dtype of every variable in it.
        group: their device group.
        indices: the variables' positions in the optimizer's variable list.
        sizes: their element counts, in the same order.
        replicas: the number of shards.
    """

    dtype: str
    group: Hashable
    indices: tuple[int, ...]
    sizes: tuple[int, ...]
    replicas: int

    @property
    def elements(self) -> int:
        """Elements of the bucket, without padding."""
        return sum(self.sizes)

    @property
    def shard_size(self) -> int:
        """Elements of every padded shard: ``ceil(elements / replicas)`` (at least 1)."""
        return max(1, -(-self.elements // self.replicas))

    def shard_lengths(self) -> tuple[int, ...]:
        """Real elements in each shard: ``elements // replicas``, plus one for the first
        ``elements % replicas`` shards."""
        base, extra = divmod(self.elements, self.replicas)
        return tuple(base + (1 if r < extra else 0) for r in range(self.replicas))

    def shard_starts(self) -> tuple[int, ...]:
        """Where each shard begins in the flat bucket."""
        starts, offset = [], 0
        for length in self.shard_lengths():
            starts.append(offset)
            offset += length
        return tuple(starts)


    def offsets(self) -> tuple[int, ...]:
        """Where each variable begins in the flat bucket."""
        starts, offset = [], 0
        for size in self.sizes:
            starts.append(offset)
            offset += size
        return tuple(starts)

    def pieces(self, replica: int) -> tuple[Piece, ...]:
        """The parts of the bucket's variables shard ``replica`` holds, in bucket order.

        A variable with no elements is listed, empty, in shard 0, so that
        every variable is held by some shard.
        """
        begin = self.shard_starts()[replica]
        end = begin + self.shard_lengths()[replica]
        found = []
        for index, start, size in zip(self.indices, self.offsets(), self.sizes, strict=True):
            low, high = max(start, begin), min(start + size, end)
            if high > low or (size == 0 and replica == 0):
                found.append(Piece(index, low - begin if size else 0, low - start if size else 0,
                                   max(high - low, 0), size))
        return tuple(found)


@dataclasses.dataclass(frozen=True)
class Piece:
    """Elements ``start:start+length`` of variable ``index`` (flattened, ``size`` in all),
    held at ``shard_offset:shard_offset+length`` of one replica's shard."""

    index: int
    shard_offset: int
    start: int
    length: int
    size: int


@dataclasses.dataclass(frozen=True)
class ZeroPlan:
    """The buckets of one optimizer's variables over ``replicas`` replicas."""

    buckets: tuple[Bucket, ...]
    replicas: int

    def shard_elements(self, replica: int) -> int:
        """Real (unpadded) elements replica ``replica`` holds slots for."""
        return sum(bucket.shard_lengths()[replica] for bucket in self.buckets)

    def summary(self) -> str:
        """One line for the run log."""
        total = sum(bucket.elements for bucket in self.buckets)
        variables = sum(len(bucket.indices) for bucket in self.buckets)
        per_replica = [self.shard_elements(r) for r in range(self.replicas)]
        return (f"optimizer state sharded over {self.replicas} replicas: {variables} "
                f"variable(s), {total:,} elements in {len(self.buckets)} bucket(s); "
                f"{min(per_replica):,} to {max(per_replica):,} elements per replica")


def plan(specs: Sequence[VariableSpec], replicas: int,
         bucket_elements: int | None = None) -> ZeroPlan:
    """The buckets of ``specs`` (in order) over ``replicas`` replicas: consecutive
    variables of one dtype and device group, up to ``bucket_elements`` per bucket
    (``BUCKET_ELEMENTS`` when ``None``).

    Raises:
        ValueError: for fewer than one replica or a variable without a static shape.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1. Received: replicas={replicas}.")
    groups: dict[tuple[str, Hashable], list[int]] = {}
    for index, spec in enumerate(specs):
        if any(d is None or d < 0 for d in spec.shape):
            raise ValueError(f"variable {spec.name!r} has no static shape: {spec.shape}.")
        groups.setdefault((spec.dtype, spec.group), []).append(index)
    buckets = []
    for (dtype, group), indices in groups.items():
        cap = BUCKET_ELEMENTS if bucket_elements is None else bucket_elements
        for run in _capped(indices, [specs[i].size for i in indices], cap):
            buckets.append(Bucket(dtype, group, tuple(run),
                                  tuple(specs[i].size for i in run), replicas))
    return ZeroPlan(tuple(buckets), replicas)


def _capped(indices: list[int], sizes: list[int], cap: int) -> list[list[int]]:
    """``indices`` cut into consecutive runs of at most ``cap`` elements (a larger
    variable alone)."""
    runs: list[list[int]] = [[]]
    total = 0
    for index, size in zip(indices, sizes, strict=True):
        if runs[-1] and total + size > cap:
            runs.append([])
            total = 0
        runs[-1].append(index)
        total += size
    return runs


def check_shardable(optimizer: str, options: dict[str, object], mode: str) -> None:
    """Refuses an optimizer whose update ZeRO stage 1 cannot shard.

    Args:
        optimizer: the optimizer's class name.
        options: its ``get_config()`` (``use_ema``, ``gradient_accumulation_steps`` are read).
        mode: the strategy's mode, for the message.

    Raises:
        ConfigError: naming the option, the optimizer and what to do.
    """
    head = (f"data_parallel.shard_optimizer_state=true (mode {mode!r}) shards the optimizer's "
            "slots element by element")
    if optimizer not in ELEMENT_WISE:
        reason = NOT_ELEMENT_WISE.get(optimizer, "hybridpar does not know its update to be "
                                                 "element-wise")
        raise ConfigError(
            f"{head}, but {optimizer} cannot be sharded: {reason}. Received: optimizer="
            f"{optimizer}. Use one of {', '.join(ELEMENT_WISE)}, or set "
            "data_parallel.shard_optimizer_state to false."
        )
    refused = {"use_ema": "keeps a moving average of every whole weight",
               "gradient_accumulation_steps": "accumulates whole gradients per replica"}
    for option, reason in refused.items():
        if options.get(option):
            raise ConfigError(
                f"{head}, but {optimizer}({option}={options[option]!r}) {reason}, which is "
                f"not sharded yet. Received: {option}={options[option]!r}. Remove {option}, "
                "or set data_parallel.shard_optimizer_state to false."
            )

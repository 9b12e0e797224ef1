"""Contiguous stage partitions that balance a cost per layer (pure Python).

The layers of a model, in topological order, are cut into ``stages``
contiguous, non-empty runs; the cut minimises the slowest stage (the sum of
its layers' costs) exactly, by dynamic programming over (layers, stages).
Layers a manual rule or ``hybridpar.stage()`` pins must land on their stage,
and, where a per-device memory limit is configured, no stage may hold more
parameter bytes than it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from hybridpar.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Unit:
    """One placeable layer (with everything nested in it) of the model.

    Attributes:
        name: the layer's name (its path when it sits in a nested model).
        cost: what the partition balances (FLOPs plus bytes, or seconds).
        param_bytes: bytes of the parameters it owns.
        pinned: the stage a manual rule or ``stage()`` gives it, or ``None``.
    """

    name: str
    cost: float
    param_bytes: int = 0
    pinned: int | None = None


@dataclasses.dataclass(frozen=True)
class Partition:
    """A cut of units into stages.

    Attributes:
        stage_of: the stage of each unit, in unit order (non-decreasing).
        stage_costs: the summed cost of each stage.
        stage_bytes: the summed parameter bytes of each stage.
    """

    stage_of: tuple[int, ...]
    stage_costs: tuple[float, ...]
    stage_bytes: tuple[int, ...]

    @property
    def bottleneck(self) -> float:
        """The slowest stage's cost."""
        return max(self.stage_costs)

    @property
    def imbalance(self) -> float:
        """The slowest stage over the mean stage (1.0 is perfect balance)."""
        return imbalance(self.stage_costs)


def imbalance(stage_costs: Sequence[float]) -> float:
    """``max / mean`` of ``stage_costs`` (1.0 for an all-zero list)."""
    mean = sum(stage_costs) / len(stage_costs)
    return max(stage_costs) / mean if mean > 0 else 1.0


def _check_pins(units: Sequence[Unit], stages: int) -> None:
    last: tuple[int, Unit] | None = None
    for position, unit in enumerate(units):
        if unit.pinned is None:
            continue
        if unit.pinned >= stages:
            raise ConfigError(
                f"Layer {unit.name!r} is pinned to stage {unit.pinned}, but "
                f"model_parallel.stages={stages} allows 0..{stages - 1}."
            )
        if last is not None and unit.pinned < last[1].pinned:
            raise ConfigError(
                f"No contiguous cut exists: layer {last[1].name!r} (position {last[0]} in "
                f"topological order) is pinned to stage {last[1].pinned}, but the later layer "
                f"{unit.name!r} (position {position}) is pinned to stage {unit.pinned}. Stages "
                "must follow the layer order; fix the model_parallel.placement rules or "
                "hybridpar.stage() marks."
            )
        last = (position, unit)


def _check_sizes(units: Sequence[Unit], stages: int, memory_limit: int | None) -> None:
    if stages > len(units):
        raise ConfigError(
            f"model_parallel.placement 'auto' cannot cut {len(units)} layer(s) "
            f"({', '.join(u.name for u in units[:8])}{', ...' if len(units) > 8 else ''}) into "
            f"model_parallel.stages={stages} non-empty stages. Lower model_parallel.stages to "
            f"at most {len(units)}."
        )
    if memory_limit is None:
        return
    too_large = [u for u in units if u.param_bytes > memory_limit]
    if too_large:
        shown = ", ".join(f"{u.name!r} ({u.param_bytes:,} bytes)" for u in too_large[:5])
        raise ConfigError(
            f"Layer(s) {shown} hold more parameter bytes than "
            f"model_parallel.device_memory_bytes={memory_limit:,} allows on any one device. "
            "Raise the limit or split the layer."
        )


def partition(
    units: Sequence[Unit], stages: int, memory_limit: int | None = None
) -> Partition:
    """The contiguous cut of ``units`` into ``stages`` with the smallest slowest stage.

    Raises:
        ConfigError: for more stages than units, pins out of topological order
            (or that leave a stage empty), or a unit or stage above
            ``memory_limit`` parameter bytes.
    """
    _check_sizes(units, stages, memory_limit)
    _check_pins(units, stages)
    count = len(units)
    cost = [0.0]
    size = [0]
    for unit in units:
        cost.append(cost[-1] + unit.cost)
        size.append(size[-1] + unit.param_bytes)
    pins = [u.pinned for u in units]
    best = [[math.inf] * (count + 1) for _ in range(stages + 1)]
    cut = [[0] * (count + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, count - (stages - k) + 1):
            # stage k-1 = units[j:i], grown leftwards until a pin or the memory stops it
            for j in range(i - 1, k - 2, -1):
                if pins[j] is not None and pins[j] != k - 1:
                    break
                if memory_limit is not None and size[i] - size[j] > memory_limit:
                    break
                value = max(best[k - 1][j], cost[i] - cost[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    if best[stages][count] == math.inf:
        raise ConfigError(_infeasible(units, stages, memory_limit))
    bounds = [count]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    stage_of = tuple(k for k in range(stages) for _ in range(bounds[k], bounds[k + 1]))
    return Partition(
        stage_of=stage_of,
        stage_costs=tuple(cost[bounds[k + 1]] - cost[bounds[k]] for k in range(stages)),
        stage_bytes=tuple(size[bounds[k + 1]] - size[bounds[k]] for k in range(stages)),
    )


def _infeasible(units: Sequence[Unit], stages: int, memory_limit: int | None) -> str:
    pinned = [(i, u) for i, u in enumerate(units) if u.pinned is not None]
    shown = ", ".join(f"{u.name!r} (position {i}) -> stage {u.pinned}" for i, u in pinned[:6])
    limit = (f" with at most model_parallel.device_memory_bytes={memory_limit:,} parameter "
             "bytes per stage" if memory_limit is not None else "")
    return (
        f"No contiguous cut of {len(units)} layer(s) into {stages} non-empty stage(s){limit} "
        f"fits the pinned layers{': ' + shown if shown else ''}. A layer pinned to stage k "
        "needs at least k layers before it and stages-1-k after it; move or remove pins"
        f"{', or raise the memory limit' if memory_limit is not None else ''}."
    )


"""A model's checkpointed variables as logical tensors, each made of the parts that hold it.

A checkpoint stores every variable whole, as the model would have it on one
device, so it restores into any topology. Most variables are one part (a
mirrored variable is one value on every replica). A variable split over
parameter servers (a ``ShardedVariable``) is one part per shard, each a row
slice of the logical tensor; the optimizer's slots of its shards (one slot
set per shard, ``compat.shard_views``) are joined the same way, so a
checkpoint written with 2 parameter servers restores into 3, or into one
device, with its optimizer state; so are the slots of a tensor-parallel
weight's shards (slices along the weight's split axis), so a checkpoint
written with ``model_parallel.tensor: 2`` restores onto another ``T`` or
onto one device. The slots ZeRO shards
(``data_parallel.shard_optimizer_state``) are stored as the slots an
unsharded optimizer has, each made of flat parts (``FlatPart``: a replica's
shard holds any range of a slot's elements, stored as boxes,
``flat_slices``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridpar.checkpoint.manifest import variable_spec
from hybridpar.compat.shard_views import sharded, stored_in_shards
from hybridpar.state import state_of


@dataclasses.dataclass(frozen=True)
class Part:
    """One variable holding ``offset:offset+rows`` along ``axis`` of a logical tensor (all:
    ``None``): rows of a parameter server's shard, or a tensor-parallel shard's slice."""

    variable: Any
    offset: int | None = None
    rows: int | None = None
    axis: int = 0


@dataclasses.dataclass(frozen=True)
class FlatPart:
    """One variable holding elements ``start:start+length`` of a logical tensor's flattened
    values, at ``source:source+length`` of its own flat value (a ZeRO shard's slot)."""

    variable: Any
    source: int
    start: int
    length: int


@dataclasses.dataclass
class Logical:
    """One checkpointed tensor: its path, full shape and dtype, and the parts that hold it."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    parts: list[Part | FlatPart]
    joins: tuple[int, str] | None = None  # (table id, slot) of a slot joined over shards

    @property
    def spec(self) -> dict[str, Any]:
        return variable_spec(self.path, self.shape, self.dtype)


def _whole(variable: Any) -> Logical:
    return Logical(variable.path, tuple(int(d) for d in variable.shape), str(variable.dtype),
                   [Part(variable)])


def _row_parts(variables: list[Any], axis: int = 0) -> list[Part]:
    parts, offset = [], 0
    for variable in variables:
        rows = int(variable.shape[axis])
        parts.append(Part(variable, offset, rows, axis))
        offset += rows
    return parts


def model_variables(variables: list[Any]) -> list[Logical]:
    """Keras variables as logical tensors (a sharded one as its shards)."""
    result = []
    for variable in variables:
        table = sharded(variable)
        if table is None:
            result.append(_whole(variable))
        else:
            result.append(Logical(variable.path, tuple(int(d) for d in variable.shape),
                                  str(variable.dtype), _row_parts(list(table.variables))))
    return result


def _shard_views(model: Any) -> list[tuple[str, Any, int]]:
    """``(slot name prefix, table, shard index)`` of every shard view the model made."""
    found = []
    for variable in model.variables:
        for index, view in enumerate(getattr(variable, "_hybridpar_shard_views", None) or ()):
            found.append((view.path.replace("/", "_") + "_", variable, index))
    return found


def optimizer_variables(model: Any, variables: list[Any]) -> list[Logical]:
    """The optimizer's variables as logical tensors: per-shard slots joined per table.

    A slot Keras made for a shard view (``add_variable_from_reference``
    names it ``<view path>_<slot>``) becomes a row part of one logical slot
    of the whole table, listed where the first shard's slot was.
    """
    views = _shard_views(model)
    result: list[Logical] = []
    joined: dict[tuple[int, str], list[tuple[int, Any]]] = {}
    for variable in variables:
        match = next(((p, t, i) for p, t, i in views
                      if variable.name.startswith(p) and len(variable.shape) > 0), None)
        if match is None:
            result.append(_whole(variable))
            continue
        prefix, table, index = match
        slot = variable.name[len(prefix):]
        group = (id(table), slot)
        if group not in joined:
            joined[group] = []
            path = variable.path.replace(f"_shard{index}_{slot}", f"_{slot}")
            result.append(Logical(path, tuple(int(d) for d in table.shape),
                                  str(variable.dtype), [], joins=group))
        joined[group].append((index, variable))
    for logical in result:
        if logical.joins is not None:
            shards = sorted(joined[logical.joins], key=lambda pair: pair[0])
            table = next(t for _, t, _ in views if id(t) == logical.joins[0])
            logical.parts = _row_parts([variable for _, variable in shards],
                                       getattr(stored_in_shards(table), "axis", 0))
    return result + _sharded_slots(model)


def _sharded_slots(model: Any) -> list[Logical]:
    """The slots ZeRO shards over the replicas, as the slots an unsharded optimizer has.

    Each is stored under the unsharded slot's place and shape, made of flat parts (one per
    local replica holding elements of it), so the checkpoint restores onto any replica
    count, sharded or not, and an unsharded one restores onto a sharded run. Sharded over
    several workers, each worker's parts are its own replicas' (``zero_shards``).
    """
    state = state_of(getattr(model, "_distribute_strategy", None))
    sharding = getattr(state, "zero", None)
    found = sharding.state_for(model.optimizer) if sharding is not None else None
    if found is None:
        return []
    return [Logical(slot.path, slot.shape, slot.dtype,
                    [FlatPart(variable, piece.shard_offset, piece.start, piece.length)
                     for variable, piece in slot.parts])
            for slot in found.checkpoint_slots()]


def specs(logicals: list[Logical]) -> list[dict[str, Any]]:
    return [logical.spec for logical in logicals]

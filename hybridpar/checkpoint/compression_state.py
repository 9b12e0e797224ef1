"""PowerSGD's state in checkpoints: each replica's error memory, written by its worker.

With ``communication.compression: powersgd`` a checkpoint holds a fourth
group, ``compression``: per compressed gradient, the error memories of all
replicas as one logical tensor (``replicas x n x m``, row ``i`` replica
``i``'s) and ``Q`` (``m x rank``), matched by position like the other groups.
Each worker saves and restores its own replicas' rows (slices of that
tensor, like a parameter server's rows of a table): a non-chief worker
writes them in its own bundle, which the chief merges (``zero_shards``), so
no worker gathers another's error memory. The chief writes ``Q``. A
checkpoint without that group (written without PowerSGD, or by an older
hybridpar), or with one for another number of replicas or another rank,
restores with zero error memory (and, for another rank, the initial ``Q``),
and the log says so once.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from hybridpar.checkpoint import storage, tensor_io
from hybridpar.checkpoint.layout import Logical, Part
from hybridpar.checkpoint.manifest import mismatches, slice_spec, variable_spec
from hybridpar.state import state_of

logger = logging.getLogger("hybridpar")

GROUP = "compression"


def _key(index: int) -> str:
    return f"{GROUP}/{index:05d}"


def _powersgd(model: Any, prepare: bool) -> tuple[Any, Any] | None:
    """The model's PowerSGD state and strategy, creating the state first with ``prepare``."""
    strategy = getattr(model, "_distribute_strategy", None)
    holder = state_of(strategy)
    compression = holder.compression if holder is not None else None
    if compression is None:
        return None
    if prepare:
        compression.prepare(model)
    found = compression.state_for(getattr(model, "optimizer", None))
    return (found, strategy) if found is not None and found.entries else None


def configured(model: Any) -> bool:
    """Whether ``model`` trains with PowerSGD, so its checkpoints hold error memory."""
    holder = state_of(getattr(model, "_distribute_strategy", None))
    compression = holder.compression if holder is not None else None
    return compression is not None and compression.kind == "powersgd"


def holds(model: Any) -> bool:
    """Whether ``model``'s PowerSGD state exists and compresses a gradient (is saved)."""
    return _powersgd(model, prepare=False) is not None


def _specs(powersgd: Any, strategy: Any) -> list[dict[str, Any]]:
    return [variable_spec(*t) for t in powersgd.tensors(strategy.num_replicas_in_sync)]


def capture(model: Any, specs: dict[str, list[dict[str, Any]]], *,
            writes: bool) -> list[tensor_io.Piece]:
    """The pieces of the model's PowerSGD state this worker writes; adds the group's specs.

    Each local replica's error memory is read on its device as its row of the
    stacked tensor; ``Q`` is read only where ``writes`` (the chief).
    """
    found = _powersgd(model, prepare=False)
    if found is None:
        return []
    powersgd, strategy = found
    specs[GROUP] = _specs(powersgd, strategy)
    pieces = []
    for k, (errors, qs) in enumerate(zip(powersgd.local_errors(strategy),
                                         powersgd.local_qs(strategy), strict=True)):
        shape = specs[GROUP][2 * k]["shape"]
        for replica, error in errors:
            with tf.device(error.device):
                pieces.append(tensor_io.Piece(_key(2 * k), slice_spec(shape, replica, 1),
                                              tf.expand_dims(error.read_value(), 0)))
        if writes:
            with tf.device(qs[0].device):
                pieces.append(tensor_io.Piece(_key(2 * k + 1), "", tf.identity(qs[0])))
    return pieces


def restore(model: Any, path: Any, manifest: dict[str, Any], reader: Any) -> None:
    """Restores the PowerSGD state of a checkpoint, or starts from zero error memory.

    Each worker reads its own replicas' rows only, each on the replica's device.
    """
    saved = manifest["variables"].get(GROUP, [])
    found = _powersgd(model, prepare=True)
    if found is None:
        if saved:
            logger.info("hybridpar: checkpoint %s holds PowerSGD state, which this run "
                        "(without communication.compression: powersgd) does not use.",
                        storage.name(path))
        return
    powersgd, strategy = found
    current = _specs(powersgd, strategy)
    errors_match = not mismatches(saved[0::2], current[0::2])
    qs_match = not mismatches(saved[1::2], current[1::2])
    for k, (errors, qs) in enumerate(zip(powersgd.local_errors(strategy),
                                         powersgd.local_qs(strategy), strict=True)):
        spec = current[2 * k]
        logical = Logical(spec["path"], tuple(spec["shape"]), spec["dtype"], [])
        for replica, error in errors:
            value = (reader.read(_key(2 * k), logical, Part(error, replica, 1))
                     if errors_match else tf.zeros([1, *spec["shape"][1:]], spec["dtype"]))
            error.assign(tf.reshape(value, error.shape))
        if qs_match:
            q = reader.array(_key(2 * k + 1), current[2 * k + 1]["dtype"])
            for local in qs:
                local.assign(q)
    if errors_match:
        return
    if not saved:
        reason = "holds no PowerSGD state"
    else:
        written = manifest.get("topology", {}).get("num_replicas", "?")
        reason = (f"holds PowerSGD state of {written} replica(s) "
                  f"{'' if qs_match else 'and another rank '}(this run: "
                  f"{strategy.num_replicas_in_sync} replica(s), rank {powersgd.rank})")
    logger.info("hybridpar: checkpoint %s %s: the PowerSGD error memory starts at zero%s.",
                storage.name(path), reason, "" if qs_match else " and Q from its initial draw")

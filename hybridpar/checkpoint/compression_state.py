"""PowerSGD's state in checkpoints: every replica's error memory and the warm-start factors.

With ``communication.compression: powersgd`` a checkpoint holds a fourth
group, ``compression``: per compressed gradient, the error memories of all
replicas stacked in replica order (``replicas x n x m``) and ``Q``
(``m x rank``), matched by position like the other groups. A checkpoint
without that group (written without PowerSGD, or by an older hybridpar), or
with one for another number of replicas or another rank, restores with zero
error memory (and, for another rank, the initial ``Q``), and the log says so
once.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hybridpar.checkpoint import storage
from hybridpar.checkpoint.manifest import mismatches, variable_spec
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


def _specs(powersgd: Any, strategy: Any) -> list[dict[str, Any]]:
    return [variable_spec(*t) for t in powersgd.tensors(strategy.num_replicas_in_sync)]


def capture(model: Any, arrays: dict[str, np.ndarray],
            specs: dict[str, list[dict[str, Any]]]) -> None:
    """Adds the model's PowerSGD state, if it has any, to ``arrays`` and ``specs``.

    Under a multi-worker strategy every worker must call this at the same step.
    """
    found = _powersgd(model, prepare=False)
    if found is None:
        return
    powersgd, strategy = found
    specs[GROUP] = _specs(powersgd, strategy)
    for index, value in enumerate(powersgd.capture(strategy)):
        arrays[_key(index)] = value


def restore(model: Any, path: Any, manifest: dict[str, Any], reader: Any) -> None:
    """Restores the PowerSGD state of a checkpoint, or starts from zero error memory."""
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
    values = [reader.array(_key(i), spec["dtype"]) for i, spec in enumerate(saved)]
    errors_match = not mismatches(saved[0::2], current[0::2])
    qs_match = not mismatches(saved[1::2], current[1::2])
    powersgd.assign(strategy, values[0::2] if errors_match else None,
                    values[1::2] if qs_match else None)
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

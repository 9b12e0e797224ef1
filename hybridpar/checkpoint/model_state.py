"""Capturing a Keras model's state into a checkpoint and restoring it, in any topology.

The state is three groups of variables: ``model`` (``model.variables``:
weights and seed-generator states), ``optimizer`` (``optimizer.variables``:
the step counter, learning rate, slots) and ``metrics``
(``model.metrics_variables``: the running means of an interrupted epoch).
Values are stored whole, in the order Keras lists the variables, so a
checkpoint written by 2 workers x 2 replicas restores into one device and
back (a mirrored variable is one value on every replica). With PowerSGD a
fourth group holds its per-replica state (``compression_state``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybridpar.checkpoint import compression_state
from hybridpar.checkpoint.files import (
    GROUPS,
    Found,
    latest,
    mismatch_message,
    mismatches,
    read_arrays,
    step_of,
    variable_spec,
    verify,
    write,
)
from hybridpar.errors import CheckpointMismatchError, ConfigError

logger = logging.getLogger("hybridpar")


def _variables(model: Any, group: str) -> list[Any]:
    if group == "model":
        return list(model.variables)
    if group == "optimizer":
        optimizer = getattr(model, "optimizer", None)
        return list(optimizer.variables) if optimizer is not None else []
    return list(getattr(model, "metrics_variables", []))


def _specs(variables: Sequence[Any]) -> list[dict[str, Any]]:
    return [variable_spec(v.path, v.shape, v.dtype) for v in variables]


def _key(group: str, index: int) -> str:
    return f"{group}/{index:05d}"


def ensure_built(model: Any) -> None:
    """Builds the optimizer's slots (in the model's strategy) so they can be restored.

    Raises:
        ConfigError: when the model has no variables yet.
    """
    if not model.variables:
        raise ConfigError(
            f"Model {model.name!r} has no variables yet, so there is nothing to restore into. "
            "Build it first (call it on a batch, or give it an Input), then restore."
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        strategy = getattr(model, "_distribute_strategy", None)
        if strategy is not None:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        else:
            optimizer.build(model.trainable_variables)


def capture(model: Any) -> tuple[dict[str, np.ndarray], dict[str, list[dict[str, Any]]]]:
    """The values of every model, optimizer and metric variable (and PowerSGD's state),
    and their specs.

    Under a multi-worker strategy every worker must call this at the same
    step: reading a metric's per-replica value sums it over all workers.
    """
    arrays: dict[str, np.ndarray] = {}
    specs: dict[str, list[dict[str, Any]]] = {}
    for group in GROUPS:
        variables = _variables(model, group)
        specs[group] = _specs(variables)
        for index, variable in enumerate(variables):
            arrays[_key(group, index)] = np.asarray(variable.numpy())
    compression_state.capture(model, arrays, specs)
    return arrays, specs


def apply(model: Any, path: Path, manifest: dict[str, Any], arrays: dict[str, np.ndarray],
          *, optimizer: bool = True, metrics: bool = True) -> bool:
    """Assigns a checkpoint's values to ``model`` (and its optimizer and metrics).

    Returns:
        Whether the metrics match (and were restored, with ``metrics``).

    Raises:
        CheckpointMismatchError: naming the model or optimizer variables whose
            count, shape or dtype differ, before anything is assigned.
    """
    groups = ["model", "optimizer"] if optimizer else ["model"]
    for group in groups:
        lines = mismatches(manifest["variables"][group], _specs(_variables(model, group)))
        if lines:
            raise CheckpointMismatchError(mismatch_message(path, group, lines))
    metrics_match = not mismatches(
        manifest["variables"]["metrics"], _specs(_variables(model, "metrics"))
    )
    if not metrics_match:
        logger.warning("hybridpar: the metrics of checkpoint %s differ from this model's; "
                       "metrics start from zero.", path.name)
    for group in groups + (["metrics"] if metrics and metrics_match else []):
        assign_group(model, group, arrays)
    if optimizer:
        compression_state.restore(model, path, manifest, arrays)
    return metrics_match


def apply_weights(model: Any, path: Path, manifest: dict[str, Any],
                  arrays: dict[str, np.ndarray]) -> None:
    """Assigns only a checkpoint's ``model`` group: weights and seed states.

    What evaluation needs. The optimizer is left alone: its variables depend
    on the topology that wrote the checkpoint (a parameter-server chief keeps
    one slot set per shard).

    Raises:
        CheckpointMismatchError: naming the model variables that differ.
    """
    lines = mismatches(manifest["variables"]["model"], _specs(_variables(model, "model")))
    if lines:
        raise CheckpointMismatchError(mismatch_message(path, "model", lines))
    assign_group(model, "model", arrays)


def assign_group(model: Any, group: str, arrays: dict[str, np.ndarray]) -> None:
    """Assigns one group (``model``, ``optimizer``, ``metrics``) of checked arrays."""
    for index, variable in enumerate(_variables(model, group)):
        variable.assign(arrays[_key(group, index)])


def save(model: Any, directory: str | os.PathLike, *, epoch: int = 0, batch: int = 0,
         extra: dict[str, Any] | None = None, write_files: bool = True) -> Path | None:
    """Captures ``model`` and writes a checkpoint named after its optimizer step.

    Args:
        model: a compiled, built Keras model.
        directory: where checkpoints go.
        epoch: the epoch to resume in.
        batch: batches of that epoch already trained (and drawn from a
            fresh iterator of that epoch).
        extra: more manifest entries (``config``, ``topology``, ``reason``).
        write_files: ``False`` on workers that only take part in capturing.

    Returns:
        The checkpoint directory, or ``None`` when ``write_files`` is False.
    """
    data = {"epoch": epoch, "batch": batch, "iterator_position": batch,
            "iterator_persists": False}
    return save_position(model, directory, data, extra=extra, write_files=write_files)


def save_position(model: Any, directory: str | os.PathLike, data: dict[str, Any], *,
                  extra: dict[str, Any] | None = None, write_files: bool = True) -> Path | None:
    """``save`` with the full data position: ``epoch``, ``batch``,
    ``iterator_position`` (batches drawn from the live iterator) and
    ``iterator_persists`` (whether that iterator spans epochs)."""
    arrays, manifest = snapshot(model, data, extra=extra)
    if not write_files:
        return None
    return write(directory, arrays, manifest)


def snapshot(model: Any, data: dict[str, Any], *,
             extra: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The values of a checkpoint in host memory and its manifest (``files.write`` them).

    Every worker of a multi-worker strategy must call this at the same step
    (see ``capture``).
    """
    arrays, specs = capture(model)
    optimizer = getattr(model, "optimizer", None)
    step = int(optimizer.iterations.numpy()) if optimizer is not None else 0
    manifest = {**(extra or {}), "step": step, "data": data, "variables": specs,
                "created": time.time()}
    return arrays, manifest


def restore(model: Any, source: str | os.PathLike, *, optimizer: bool = True) -> Found:
    """Restores ``model`` (and its optimizer) from a checkpoint, in any topology.

    Args:
        model: a built Keras model, created in whatever scope it will train or
            predict in (one device, mirrored, multi-worker).
        source: a checkpoint directory (``.../ckpt-00000123``) or a directory
            of checkpoints, whose newest undamaged one is used.
        optimizer: restore the optimizer's variables (step, slots) too.

    Returns:
        The checkpoint used.

    Raises:
        FileNotFoundError: when ``source`` holds no checkpoint.
        CheckpointDamagedError: when the chosen checkpoint (or every one) is damaged.
        CheckpointMismatchError: naming the variables that do not match.
    """
    source = Path(source)
    if step_of(source) is not None:
        found: Found | None = Found(source, verify(source))
    else:
        found = latest(source)
    if found is None:
        raise FileNotFoundError(
            f"No checkpoint in {source} (expected directories named ckpt-<step>). "
            "Check the path, or train with checkpoint.dir set to write one."
        )
    ensure_built(model)
    apply(model, found.path, found.manifest, read_arrays(found.path), optimizer=optimizer)
    return found

"""Capturing a Keras model's state into a checkpoint and restoring it, in any topology.

The state is three groups of variables: ``model`` (``model.variables``:
weights and seed-generator states), ``optimizer`` (``optimizer.variables``:
the step counter, learning rate, slots) and ``metrics``
(``model.metrics_variables``: the running means of an interrupted epoch).
Each is stored whole, as a logical tensor (``layout``), in the order Keras
lists the variables, so a checkpoint written by 2 workers x 2 replicas, or
with a table sharded over 2 parameter servers, restores into one device, 3
parameter servers, and back. With PowerSGD a fourth group holds its
per-replica state (``compression_state``).

Only the chief reads the model and optimizer values (as tensors on their
devices, ``tensor_io.snapshot``); every worker reads the metrics, since
under a multi-worker strategy reading one sums it over all workers.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from hybridpar.checkpoint import (
    compression_state,
    files,
    layout,
    npz,
    publication,
    shared_restore,
    storage,
    tensor_io,
    zero_shards,
)
from hybridpar.checkpoint.files import Found
from hybridpar.checkpoint.manifest import (
    FORMAT,
    FORMAT_V2,
    GROUPS,
    key,
    mismatch_message,
)
from hybridpar.checkpoint.manifest import mismatches as spec_mismatches
from hybridpar.compat.shard_views import shard_views
from hybridpar.errors import CheckpointMismatchError, ConfigError
from hybridpar.state import state_of

logger = logging.getLogger("hybridpar")

Reader = tensor_io.BundleReader | tensor_io.ArrayReader


def _variables(model: Any, group: str) -> list[Any]:
    if group == "model":
        return list(model.variables)
    if group == "optimizer":
        optimizer = getattr(model, "optimizer", None)
        return list(optimizer.variables) if optimizer is not None else []
    return list(getattr(model, "metrics_variables", []))


def logicals(model: Any, group: str) -> list[layout.Logical]:
    """One group's variables as logical tensors (sharded ones joined)."""
    if group == "optimizer":
        return layout.optimizer_variables(model, _variables(model, group))
    return layout.model_variables(_variables(model, group))


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
        with shard_views(model):  # a sharded table gets one slot set per shard, as in training
            if strategy is not None:
                with strategy.scope():
                    optimizer.build(model.trainable_variables)
            else:
                optimizer.build(model.trainable_variables)


def snapshot(model: Any, data: dict[str, Any], *, extra: dict[str, Any] | None = None,
             writes: bool = True) -> tuple[list[tensor_io.Piece], dict[str, Any]]:
    """The checkpoint's values (tensors on their devices) and its manifest (without files).

    Every worker of a multi-worker strategy must call this at the same step;
    only with ``writes`` are the model and optimizer read.
    """
    groups = {group: logicals(model, group) for group in GROUPS}
    specs = {group: layout.specs(found) for group, found in groups.items()}
    read = groups if writes else {"metrics": groups["metrics"]}
    pieces = tensor_io.snapshot(read)
    if not writes:  # a worker that writes only the ZeRO shards its replicas hold, if any
        pieces = [] if zero_shards.sharded_over_workers(model) is None else _own_shards(
            groups["optimizer"])
    pieces += compression_state.capture(model, specs, writes=writes)
    optimizer = getattr(model, "optimizer", None)
    step = int(optimizer.iterations.numpy()) if optimizer is not None else 0
    manifest = {**(extra or {}), "format": FORMAT_V2, "step": step, "data": data,
                "variables": specs, "created": time.time()}
    own = own_writer(model)
    if own is not None:
        manifest["worker_bundles"] = own[1]  # whose bundles the chief merges
    if writes:
        manifest["model_config"] = architecture(model)  # what `checkpoint export` rebuilds
    return pieces, manifest


def _own_shards(optimizer: list[layout.Logical]) -> list[tensor_io.Piece]:
    own = {key("optimizer", index) for index, logical in enumerate(optimizer)
           if any(isinstance(part, layout.FlatPart) for part in logical.parts)}
    return [p for p in tensor_io.snapshot({"optimizer": optimizer}) if p.key in own]


def _saves_input(model: Any) -> bool:
    """Whether the running ``fit`` saves its input iterator's state (``input_state``)."""
    state = state_of(getattr(model, "_distribute_strategy", None))
    return bool(getattr(getattr(state, "trainer", None), "fit_saves_input", False))


def own_writer(model: Any, *, planned: bool = False) -> tuple[int, int] | None:
    """``(this worker, workers)`` when each worker writes state only it holds (ZeRO shards
    over workers, PowerSGD's error memory, the input iterator's state), else ``None``.

    Args:
        planned: count PowerSGD as configured, before its state exists (training begins).
    """
    sharded = zero_shards.sharded_over_workers(model)
    if sharded is not None:
        return sharded.worker, sharded.workers
    extended = getattr(getattr(model, "_distribute_strategy", None), "extended", None)
    workers = getattr(extended, "_num_workers", 1)
    powersgd = compression_state.configured(model) if planned else compression_state.holds(model)
    own = workers > 1 and (powersgd or _saves_input(model))
    return (extended._id_in_cluster, workers) if own else None


def announce_own_shards(model: Any, writes: bool) -> None:
    """At the start of training where workers write their own state (``own_writer``): a
    non-chief announces that it saves its part, and the chief remembers to check every
    worker did (``zero_shards.check_savers``, before its first save)."""
    own = own_writer(model, planned=True)
    if own is not None and not writes:
        zero_shards.announce_saver(own[0])
    model._hybridpar_savers_unchecked = own is not None and writes


def check_own_shards(model: Any) -> None:
    """On the chief before a save: raises CheckpointWriteError, once per ``fit``, when a
    worker holding state of its own has no checkpoint callback."""
    if getattr(model, "_hybridpar_savers_unchecked", False):
        zero_shards.check_savers(own_writer(model, planned=True)[1])
        model._hybridpar_savers_unchecked = False


def write_own_shards(model: Any, directory: str | os.PathLike, step: int,
                     pieces: list[tensor_io.Piece]) -> None:
    """On a worker that does not write the checkpoint: writes the state only it holds
    (``snapshot``'s pieces there: ZeRO shards, PowerSGD error memory; nothing without)."""
    own = own_writer(model)
    if own is not None:
        zero_shards.write_own(directory, step, own[0], pieces)


def architecture(model: Any) -> str | None:
    """``model.to_json()``, or ``None`` for a model Keras cannot serialize (computed once
    per model: it is a third of a small model's snapshot time)."""
    cached = getattr(model, "_hybridpar_architecture", False)
    if cached is not False:
        return cached
    try:
        text = model.to_json()
    except Exception:  # a subclassed model without get_config: exported from Python only
        text = None
    model._hybridpar_architecture = text
    return text


def reader(path: str | os.PathLike, manifest: dict[str, Any]) -> Reader:
    """The reader of a checkpoint's values, in either format."""
    if manifest.get("format") == FORMAT:
        logger.info("hybridpar: checkpoint %s is in an earlier hybridpar's format (%s: one "
                    "state.npz), read whole on this task; the checkpoints written from now "
                    "on are %s (TensorFlow's tensor bundle, one file per task).",
                    storage.name(path), FORMAT, FORMAT_V2)
        return tensor_io.ArrayReader(npz.read_arrays(path))
    return tensor_io.BundleReader(path)


def matches(model: Any, manifest: dict[str, Any], group: str) -> bool:
    """Whether one group of ``model`` has the checkpoint's variables (count, shapes, dtypes)."""
    current = layout.specs(logicals(model, group))
    return not spec_mismatches(manifest["variables"][group], current)


def _check(model: Any, path: Any, manifest: dict[str, Any], group: str) -> None:
    current = layout.specs(logicals(model, group))
    lines = spec_mismatches(manifest["variables"][group], current)
    if lines:
        raise CheckpointMismatchError(mismatch_message(path, group, lines))


def apply(model: Any, path: Any, manifest: dict[str, Any], values: Reader,
          *, optimizer: bool = True, metrics: bool = True,
          share: tuple[int, int] | None = None) -> bool:
    """Assigns a checkpoint's values to ``model`` (and its optimizer and metrics).

    Args:
        share: as ``assign_groups``'s.

    Returns:
        Whether the metrics match (and were restored, with ``metrics``).

    Raises:
        CheckpointMismatchError: naming the model or optimizer variables whose
            count, shape or dtype differ, before anything is assigned.
    """
    groups = ["model", "optimizer"] if optimizer else ["model"]
    for group in groups:
        _check(model, path, manifest, group)
    metrics_match = not spec_mismatches(manifest["variables"]["metrics"],
                                        layout.specs(logicals(model, "metrics")))
    if not metrics_match:
        logger.warning("hybridpar: the metrics of checkpoint %s differ from this model's; "
                       "metrics start from zero.", storage.name(path))
    assign_groups(model, groups + (["metrics"] if metrics and metrics_match else []), values,
                  share)
    if optimizer:
        compression_state.restore(model, path, manifest, values)
    return metrics_match


def apply_weights(model: Any, path: Any, manifest: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Assigns only a checkpoint's ``model`` group (weights and seed states) from host arrays.

    What evaluation needs; the optimizer is left alone.

    Raises:
        CheckpointMismatchError: naming the model variables that differ.
    """
    _check(model, path, manifest, "model")
    assign_groups(model, ["model"], tensor_io.ArrayReader(arrays))


def assign_groups(model: Any, groups: list[str], values: Reader,
                  share: tuple[int, int] | None = None) -> None:
    """Assigns groups (``model``, ``optimizer``, ``metrics``) of a checked checkpoint.

    Each task's parts are read and assigned by that task, the tasks at the same
    time (``tensor_io.per_host``): the parameter servers restore side by side.

    Args:
        share: ``(this worker, workers)`` when every worker of a multi-worker
            strategy restores at once: each reads its share of the replicated
            variables and receives the rest (``shared_restore``).
    """
    def assign(name: str, logical: layout.Logical, part: Any) -> None:
        tensor_io.assign(part, values.read(name, logical, part))

    items = [(key(group, index), logical, part)
             for group in groups for index, logical in enumerate(logicals(model, group))
             for part in logical.parts]
    if share is not None:
        items = shared_restore.restore(model.distribute_strategy, items, values, *share)
    tensor_io.per_host([(tensor_io.host_of(tensor_io.device_of(part.variable)),
                         functools.partial(assign, name, logical, part))
                        for name, logical, part in items])


def write(directory: str | os.PathLike, pieces: list[tensor_io.Piece],
          manifest: dict[str, Any]) -> Any:
    """Writes a snapshot as checkpoint ``ckpt-<step>`` (partial directory, then published)."""
    workers = manifest.get("worker_bundles", 1)

    def files_of(partial: Any) -> dict[str, dict[str, Any]]:
        written = zero_shards.collect(int(manifest["step"]), workers) if workers > 1 else []
        return tensor_io.write(partial, pieces, written)

    return publication.write_and_publish(directory, manifest, files_of)


def save(model: Any, directory: str | os.PathLike, *, epoch: int = 0, batch: int = 0,
         extra: dict[str, Any] | None = None, write_files: bool = True) -> Any:
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
                  extra: dict[str, Any] | None = None, write_files: bool = True) -> Any:
    """``save`` with the full data position: ``epoch``, ``batch``,
    ``iterator_position`` (batches drawn from the live iterator) and
    ``iterator_persists`` (whether that iterator spans epochs)."""
    pieces, manifest = snapshot(model, data, extra=extra, writes=write_files)
    if not write_files:
        write_own_shards(model, directory, int(manifest["step"]), pieces)
        return None
    return write(directory, pieces, manifest)


def parameter_server(model: Any) -> bool:
    """Whether ``model`` lives in a hybridpar parameter-server strategy (its ps write and read)."""
    state = state_of(getattr(model, "_distribute_strategy", None))
    return state is not None and state.mode == "parameter_server"


def restore(model: Any, source: str | os.PathLike, *, optimizer: bool = True) -> Found:
    """Restores ``model`` (and its optimizer) from a checkpoint, in any topology.

    Args:
        model: a built Keras model, created in whatever scope it will train or
            predict in (one device, mirrored, multi-worker, parameter server).
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
    deep = not parameter_server(model)  # there the ps check what they read (CRC32C)
    if files.step_of(source) is not None:
        found: Found | None = Found(storage.location(source), files.verify(source, deep=deep))
    else:
        found = files.latest(source, deep=deep)
    if found is None:
        raise FileNotFoundError(
            f"No checkpoint in {source} (expected directories named ckpt-<step>). "
            "Check the path, or train with checkpoint.dir set to write one."
        )
    ensure_built(model)
    apply(model, found.path, found.manifest, reader(found.path, found.manifest),
          optimizer=optimizer)
    return found

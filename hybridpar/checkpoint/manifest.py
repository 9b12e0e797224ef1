"""The checkpoint format's pure rules: names, manifests, variable specs, slices, resume plans.

No TensorFlow and no file access here (``files`` and ``storage`` do the I/O),
so everything is unit-tested in milliseconds.

Two formats exist:

- ``hybridpar-checkpoint/2`` (written now): ``state.index`` and
  ``state.data-<i>-of-<n>``, TensorFlow's own tensor-bundle format (what
  ``tf.train.Checkpoint`` writes and ``tf.train.load_checkpoint`` reads), one
  data file per task that holds variables (each parameter server writes its
  own), keyed ``<group>/<index>`` (``model/00003``); a sharded variable is
  stored as slices of one logical tensor, so it restores into any number of
  shards.
- ``hybridpar-checkpoint/1`` (read only): one ``state.npz`` written by the chief.

Both have ``manifest.json``, written last by the chief: step, data position,
config, topology, the logical variables of each group and every file's size
and checksum: the SHA-256 of ``state.npz`` or ``state.index``, and for a
format-2 data file ``CRC32C``, TensorFlow's checksum of each tensor, computed
as it was written and kept in the index (so the index's SHA-256 covers them).
Format-2 checkpoints written before 2026-12-04 hold a SHA-256 for data files
too; it is still checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

FORMAT = "hybridpar-checkpoint/1"
FORMAT_V2 = "hybridpar-checkpoint/2"
FORMATS = (FORMAT, FORMAT_V2)
STATE_FILE = "state.npz"
STATE_PREFIX = "state"
INDEX_FILE = "state.index"
MANIFEST_FILE = "manifest.json"
GROUPS = ("model", "optimizer", "metrics")
END_FILE = "training-end.json"
END_FORMAT = "hybridpar-training-end/1"
PARTIAL_PREFIX = ".partial-"
CRC32C = "tensorflow-crc32c-per-tensor"  # a data file's "checksum": kept in state.index
ZERO_STAGING_PREFIX = ".zero-"  # a worker's own ZeRO shards, before the chief merges them
_NAME_RE = re.compile(r"^ckpt-(\d{8,})$")
_MAX_LISTED = 8


def checkpoint_name(step: int) -> str:
    """``ckpt-00000123`` for step 123."""
    return f"ckpt-{step:08d}"


def step_of_name(name: str) -> int | None:
    """The step in a checkpoint directory's name, or ``None`` if it is not one."""
    match = _NAME_RE.match(name)
    return int(match[1]) if match else None


def key(group: str, index: int) -> str:
    """``model/00003``: the key of a group's variable in the state files."""
    return f"{group}/{index:05d}"


def data_file(shard: int, shards: int) -> str:
    """``state.data-00001-of-00002``: TensorFlow's name for a bundle's data file."""
    return f"{STATE_PREFIX}.data-{shard:05d}-of-{shards:05d}"


def slice_spec(full_shape: Sequence[int], offset: int | None, length: int | None,
               axis: int = 0) -> str:
    """TensorFlow's ``shape_and_slice`` for ``offset:offset+length`` along ``axis`` of a tensor.

    ``""`` (the whole tensor) when ``offset`` is ``None``.
    """
    if offset is None:
        return ""
    dims = " ".join(str(int(d)) for d in full_shape)
    ranges = [f"{offset},{length}" if dim == axis else "-" for dim in range(len(full_shape))]
    return f"{dims} {':'.join(ranges)}"


def state_files(manifest: dict[str, Any]) -> list[str]:
    """The state files a manifest lists (without the manifest itself)."""
    return sorted(manifest.get("files", {}))


def file_problem(name: str, size: int | None, expected: dict[str, Any]) -> str | None:
    """What is wrong with a state file of ``size`` bytes (``None``: missing), or ``None``."""
    if size is None:
        return f"{name} is missing"
    if size != expected["bytes"]:
        return f"{name} has {size} bytes, the manifest says {expected['bytes']} (truncated?)"
    return None


def hash_problem(name: str, actual: str, expected: dict[str, Any]) -> str | None:
    """The message for a state file whose SHA-256 differs from the manifest's, or ``None``."""
    if actual == expected["sha256"]:
        return None
    return (f"{name} has SHA-256 {actual[:12]}..., the manifest says "
            f"{expected['sha256'][:12]}...")


def variable_spec(path: str, shape: Sequence[int], dtype: str) -> dict[str, Any]:
    return {"path": path, "shape": [int(d) for d in shape], "dtype": str(dtype)}


def _describe(spec: dict[str, Any]) -> str:
    return f"{spec['path']} {tuple(spec['shape'])} {spec['dtype']}"


def mismatches(saved: Sequence[dict], current: Sequence[dict]) -> list[str]:
    """Lines naming the variables whose position, shape or dtype differ.

    Variables are matched by position (Keras's variable order), so a model
    rebuilt in another process, where Keras may number layer names
    differently, still matches.
    """
    lines = []
    for index in range(max(len(saved), len(current))):
        ours = current[index] if index < len(current) else None
        theirs = saved[index] if index < len(saved) else None
        if theirs is None:
            lines.append(f"{_describe(ours)}: not in the checkpoint")
        elif ours is None:
            lines.append(f"{_describe(theirs)}: in the checkpoint, not in this model")
        elif (ours["shape"], ours["dtype"]) != (theirs["shape"], theirs["dtype"]):
            lines.append(f"{_describe(ours)} in this model, {_describe(theirs)} in the checkpoint")
    return lines


def mismatch_message(path: Any, group: str, lines: Sequence[str]) -> str:
    shown = list(lines[:_MAX_LISTED])
    if len(lines) > _MAX_LISTED:
        shown.append(f"... and {len(lines) - _MAX_LISTED} more")
    return (
        f"Checkpoint {path} was written by a different {group}: {len(lines)} variable(s) do "
        f"not match: " + "; ".join(shown) + ". Restore it into the model that wrote it, or "
        "choose another checkpoint.dir for this model."
    )


def describe_topology(topology: dict[str, Any]) -> str:
    """``multi_worker, 2 worker(s) x 2 replica(s)`` from a manifest's topology."""
    workers = topology.get("num_workers", 1)
    replicas = topology.get("num_replicas", 1)
    if topology.get("mode") == "parameter_server":  # the chief's one replica, asynchronous workers
        shards = topology.get("num_ps")
        held = f", variables on {shards} parameter server(s)" if shards else ""
        return f"parameter_server, {workers} training task(s) (chief and workers){held}"
    per_worker = replicas // workers if workers else replicas
    return f"{topology.get('mode', '?')}, {workers} worker(s) x {per_worker} replica(s)"


def resume_plan(
    manifest: dict[str, Any], steps_per_epoch: int | None
) -> tuple[int, int, int]:
    """Where to resume: ``(epoch, batches of it to skip, extra batches to skip first)``.

    A checkpoint taken after the last batch of an epoch but before the epoch
    ended resumes at the next epoch. The extra batches are those a persistent
    iterator (``steps_per_epoch`` over a repeated dataset) consumed in
    earlier epochs.
    """
    data = manifest["data"]
    epoch, batch = int(data["epoch"]), int(data["batch"])
    position = int(data["iterator_position"])
    persists = bool(data["iterator_persists"])
    if steps_per_epoch and batch >= steps_per_epoch and not persists:
        return epoch + 1, 0, 0
    return epoch, batch, max(position - batch, 0) if persists else 0


def asynchronous_resume(
    manifest: dict[str, Any], steps_per_epoch: int | None
) -> tuple[int, int, str]:
    """Where parameter-server training resumes: ``(epoch, steps of it done, how, in words)``.

    Workers read their input asynchronously, so there is no iterator
    position to skip to: the steps done in the saved epoch are not scheduled
    again, and each worker's input starts from its beginning. That needs the
    epoch to have the length it had when the checkpoint was written (its
    ``steps_per_epoch``, recorded by parameter-server saves); otherwise, or
    when the epoch had ended, training resumes at the next epoch.
    """
    data = manifest["data"]
    epoch, batch = int(data["epoch"]), int(data["batch"])
    written = data.get("steps_per_epoch")
    if batch == 0:
        return epoch, 0, f"at the start of epoch {epoch + 1}"
    changed = written is not None and steps_per_epoch is not None and written != steps_per_epoch
    if changed or (steps_per_epoch is not None and batch >= steps_per_epoch):
        why = (f"it was written with steps_per_epoch={written} and this fit has "
               f"{steps_per_epoch}" if changed else "its epoch had ended")
        return epoch + 1, 0, (f"at the start of epoch {epoch + 2}, not inside epoch "
                              f"{epoch + 1} after its step {batch}: {why}")
    return epoch, batch, (f"inside epoch {epoch + 1}, after its first {batch} step(s); each "
                          "worker's input starts again from its beginning")

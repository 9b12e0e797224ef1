"""Checkpoint directories on disk: listing, checking, publishing, pruning, the end record.

A checkpoint is a directory ``<dir>/ckpt-<optimizer step, 8 digits>/``
(``manifest`` describes its two formats). It is written under
``.partial-...`` and published only once complete: on a local filesystem
the partial directory is renamed into place; on other filesystems
(``ram://``, ``gs://``, ``s3://``, where a directory rename is a copy or
loses files) each file is moved into ``ckpt-<step>/`` and the manifest
last, so a checkpoint without its manifest reads as damaged. A damaged
checkpoint (truncated, edited, missing its manifest) fails its check and
the previous one is used.

When ``fit`` ends, the chief also writes ``<dir>/training-end.json`` naming
the final checkpoint (the evaluator stops after it); a new ``fit`` removes
it. Directories without it (written before it existed) read as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import time
from typing import Any

import numpy as np

from hybridpar.checkpoint import storage
from hybridpar.checkpoint.manifest import (  # noqa: F401  (re-exported: the format's names)
    END_FILE,
    END_FORMAT,
    FORMAT,
    FORMAT_V2,
    FORMATS,
    GROUPS,
    INDEX_FILE,
    MANIFEST_FILE,
    PARTIAL_PREFIX,
    STATE_FILE,
    asynchronous_resume,
    checkpoint_name,
    describe_topology,
    file_problem,
    hash_problem,
    mismatch_message,
    mismatches,
    resume_plan,
    step_of_name,
    variable_spec,
)
from hybridpar.checkpoint.storage import Location
from hybridpar.errors import CheckpointDamagedError, ConfigError

logger = logging.getLogger("hybridpar")

Path = storage.Path  # what local locations are


def step_of(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint directory's name, or ``None`` if it is not one."""
    return step_of_name(storage.name(path))


def list_checkpoints(directory: str | os.PathLike) -> list[Location]:
    """Finished checkpoint directories under ``directory``, oldest step first.

    Unfinished writes (``.partial-*``) are never listed; damage is only
    found by ``verify``.
    """
    names = [n for n in storage.listdir(directory) if step_of_name(n) is not None]
    found = [storage.join(directory, n) for n in names]
    return sorted((p for p in found if storage.isdir(p)), key=step_of)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's manifest.

    Raises:
        CheckpointDamagedError: when it is missing, unreadable or of no known format.
    """
    try:
        manifest = json.loads(storage.read_text(storage.join(path, MANIFEST_FILE)))
    except FileNotFoundError:
        raise CheckpointDamagedError(f"{path} has no {MANIFEST_FILE}") from None
    except (OSError, ValueError) as err:
        raise CheckpointDamagedError(f"{path}/{MANIFEST_FILE} is unreadable ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        raise CheckpointDamagedError(
            f"{path}/{MANIFEST_FILE} is not a {FORMAT_V2} manifest "
            f"(format: {manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    return manifest


def check_files(path: str | os.PathLike, manifest: dict[str, Any], *, deep: bool = True) -> None:
    """Checks every state file against the manifest: its size, and with ``deep`` its SHA-256.

    Raises:
        CheckpointDamagedError: naming the first file that is missing or differs.
    """
    for name, expected in sorted(manifest["files"].items()):
        file = storage.join(path, name)
        problem = file_problem(str(file), storage.size(file), expected)
        if problem is None and deep:
            try:
                problem = hash_problem(str(file), storage.sha256_of(file)[1], expected)
            except FileNotFoundError:
                problem = f"{file} is missing"
        if problem:
            raise CheckpointDamagedError(problem)


def verify(path: str | os.PathLike, *, deep: bool = True) -> dict[str, Any]:
    """Reads a checkpoint's manifest and checks its state files against it.

    Args:
        deep: also compare every file's SHA-256 (reads each file once);
            otherwise sizes only (TensorFlow checks each tensor's CRC32C as
            it restores it).

    Returns:
        The manifest.

    Raises:
        CheckpointDamagedError: saying what is missing, unreadable or does
            not match its checksum.
    """
    manifest = read_manifest(path)
    check_files(path, manifest, deep=deep)
    return manifest


def load(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A format-1 checkpoint's manifest and arrays, checked and read from one read of ``state.npz``.

    Reading from the bytes that were checked means a checkpoint deleted
    meanwhile (``prune`` of another process) is either read whole or not at all.

    Raises:
        FileNotFoundError: when the checkpoint no longer exists.
        CheckpointDamagedError: as ``verify``.
    """
    state = storage.join(path, STATE_FILE)
    try:
        manifest = read_manifest(path)
        try:
            with storage.open_file(state, "rb") as stream:
                data = stream.read()
        except (FileNotFoundError, OSError):
            raise CheckpointDamagedError(f"{state} is missing") from None
        expected = manifest["files"][STATE_FILE]
        problem = file_problem(str(state), len(data), expected) or hash_problem(
            str(state), _sha256(data), expected)
        if problem:
            raise CheckpointDamagedError(problem)
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            return manifest, {key: arrays[key] for key in arrays.files}
    except CheckpointDamagedError:
        if not storage.isdir(path):
            raise FileNotFoundError(f"checkpoint {path} no longer exists") from None
        raise


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Found:
    """The newest undamaged checkpoint, and the damaged ones skipped to reach it."""

    path: Location
    manifest: dict[str, Any]
    skipped: tuple[tuple[Location, str], ...] = ()

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


def latest(directory: str | os.PathLike, *, deep: bool = True,
           below: int | None = None) -> Found | None:
    """The newest checkpoint in ``directory`` that passes ``verify``.

    Each damaged checkpoint on the way is logged (what is wrong, which one
    is used instead) and listed in ``Found.skipped``.

    Args:
        deep: as ``verify``.
        below: consider only checkpoints of an older step than this.

    Returns:
        ``None`` when ``directory`` holds no checkpoint at all.

    Raises:
        CheckpointDamagedError: when there are checkpoints but every one is
            damaged (training from scratch would silently lose them).
    """
    skipped: list[tuple[Location, str]] = []
    candidates = [p for p in list_checkpoints(directory) if below is None or step_of(p) < below]
    for path in reversed(candidates):
        try:
            manifest = verify(path, deep=deep)
        except CheckpointDamagedError as err:
            logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous one.",
                           storage.name(path), err)
            skipped.append((path, str(err)))
            continue
        if skipped:
            logger.warning("hybridpar: using checkpoint %s (step %s) instead of the damaged %s.",
                           storage.name(path), manifest["step"],
                           ", ".join(storage.name(p) for p, _ in skipped))
        return Found(path, manifest, tuple(skipped))
    if skipped:
        reasons = "; ".join(reason for _, reason in skipped)
        raise CheckpointDamagedError(
            f"every checkpoint in {directory} is damaged ({reasons}). Move them away to train "
            "from scratch, or point checkpoint.dir at a directory with a good checkpoint."
        )
    return None


def partial_for(directory: str | os.PathLike, step: int) -> Location:
    """The partial directory a checkpoint of ``step`` is written into by this process."""
    return storage.join(directory, f"{PARTIAL_PREFIX}{checkpoint_name(step)}-{os.getpid()}")


def publish(directory: str | os.PathLike, partial: str | os.PathLike,
            manifest: dict[str, Any]) -> Location:
    """Writes the manifest into ``partial`` and publishes it as ``ckpt-<step>``.

    ``manifest`` must hold ``format``, ``step`` and ``files`` (the state
    files already in ``partial``). An existing checkpoint of the same step
    is kept as it is (``partial`` is removed).
    """
    final = storage.join(directory, checkpoint_name(int(manifest["step"])))
    text = json.dumps(manifest, indent=1).encode()
    try:
        if storage.exists(final):
            return final
        if storage.scheme(directory) is None:
            storage.write_bytes(storage.join(partial, MANIFEST_FILE), text)
            storage.fsync_dir(partial)
            storage.rename(partial, final)
            storage.fsync_dir(directory)
            return final
        storage.makedirs(final)
        for name in manifest["files"]:
            storage.rename(storage.join(partial, name), storage.join(final, name))
        storage.write_bytes(storage.join(partial, MANIFEST_FILE), text)
        storage.rename(storage.join(partial, MANIFEST_FILE), storage.join(final, MANIFEST_FILE))
        return final
    finally:
        storage.rmtree(partial)


def write(directory: str | os.PathLike, arrays: dict[str, np.ndarray],
          manifest: dict[str, Any]) -> Location:
    """Writes a format-1 checkpoint (one ``state.npz``) atomically.

    hybridpar writes format 2 (``tensor_io``); this stays to write the
    checkpoints of older versions in tests and tools. ``manifest`` must
    hold ``step``; its ``format`` and ``files`` are filled in here.
    """
    final = storage.join(directory, checkpoint_name(int(manifest["step"])))
    if storage.exists(final):
        return final
    partial = partial_for(directory, int(manifest["step"]))
    storage.rmtree(partial)
    storage.makedirs(partial)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    try:
        storage.write_bytes(storage.join(partial, STATE_FILE), data)
    except BaseException:
        storage.rmtree(partial)
        raise
    entry = {"bytes": len(data), "sha256": _sha256(data)}
    return publish(directory, partial, {**manifest, "format": FORMAT,
                                        "files": {STATE_FILE: entry}})


def prune(directory: str | os.PathLike, keep: int) -> list[Location]:
    """Deletes all but the newest ``keep`` checkpoints; returns the deleted ones.

    Locally each is renamed to a ``.partial-`` name first, so a crash
    mid-delete leaves nothing that looks like a checkpoint; elsewhere its
    manifest goes first, which makes it read as damaged until it is gone.
    """
    stale = list_checkpoints(directory)[:-keep] if keep > 0 else []
    for path in stale:
        if storage.scheme(directory) is None:
            doomed = storage.join(directory, f"{PARTIAL_PREFIX}deleted-{storage.name(path)}-"
                                             f"{os.getpid()}")
            storage.rename(path, doomed)
            storage.rmtree(doomed)
        else:
            storage.remove(storage.join(path, MANIFEST_FILE))
            storage.rmtree(path)
    return stale


def remove_partials(directory: str | os.PathLike) -> None:
    """Removes unfinished writes left by a process that died (call on the writer only)."""
    for name in storage.listdir(directory):
        if name.startswith(PARTIAL_PREFIX):
            storage.rmtree(storage.join(directory, name))


def write_end(directory: str | os.PathLike, *, step: int, epoch: int, epochs: int) -> Location:
    """Records in ``directory`` that ``fit`` ended, with its final checkpoint (chief only).

    Args:
        step: the optimizer step of the final checkpoint (``ckpt-<step>``).
        epoch: the epochs completed.
        epochs: the ``epochs`` that ``fit`` was given.

    The record is written to a partial file and renamed into place.
    """
    record = {"format": END_FORMAT, "step": step, "checkpoint": checkpoint_name(step),
              "epoch": epoch, "epochs": epochs, "created": time.time()}
    partial = storage.join(directory, f"{PARTIAL_PREFIX}{END_FILE}-{os.getpid()}")
    storage.write_bytes(partial, json.dumps(record, indent=1).encode())
    final = storage.join(directory, END_FILE)
    storage.rename(partial, final)
    storage.fsync_dir(directory)
    return final


def read_end(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The record ``write_end`` left in ``directory``, or ``None`` while training goes on."""
    try:
        record = json.loads(storage.read_text(storage.join(directory, END_FILE)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("hybridpar: %s in %s is unreadable (%s); ignoring it.", END_FILE,
                       directory, err)
        return None
    return record if isinstance(record, dict) and record.get("format") == END_FORMAT else None


def remove_end(directory: str | os.PathLike) -> None:
    """Removes the end record when a new ``fit`` starts (chief only)."""
    storage.remove(storage.join(directory, END_FILE))


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a format-1 checkpoint's ``state.npz`` (verify it first)."""
    with storage.open_file(storage.join(path, STATE_FILE), "rb") as stream:
        data = stream.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as state:
        return {key: state[key] for key in state.files}


def ensure_writable(directory: str | os.PathLike, key: str = "checkpoint.dir") -> Location:
    """Creates ``directory`` if needed and proves it can be written.

    Raises:
        ConfigError: naming the key, the directory and the error (an unknown
            URL scheme among them).
    """
    storage.check_scheme(directory, key)
    probe = storage.join(directory, f".hybridpar-write-probe-{os.getpid()}")
    try:
        storage.makedirs(directory)
        storage.write_bytes(probe, b"")
        storage.remove(probe)
    except Exception as err:  # OSError locally, tf.errors.OpError elsewhere
        reason = getattr(err, "strerror", None) or getattr(err, "message", None) or err
        raise ConfigError(
            f"{key}={str(directory)!r} is not a writable directory "
            f"({reason}). Choose a directory this process can create and "
            "write, before training starts."
        ) from None
    return storage.location(directory)

"""The checkpoint directory's format: names, listing, checking, keep-N selection, damage fallback.

A checkpoint is a directory ``<dir>/ckpt-<optimizer step, 8 digits>/``
(``manifest`` describes its two formats), written under a ``.partial-...``
name and published once complete (``publication``). A damaged checkpoint
(truncated, edited, missing its manifest) fails its check and the previous
one is used. Format 1's ``state.npz`` is read and written by ``npz``, the
record of ``fit``'s end by ``end_record``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from hybridpar.checkpoint import storage
from hybridpar.checkpoint.manifest import (
    CRC32C,
    FORMAT_V2,
    FORMATS,
    INDEX_FILE,
    MANIFEST_FILE,
    PARTIAL_PREFIX,
    checkpoint_name,
    file_problem,
    hash_problem,
    step_of_name,
)
from hybridpar.checkpoint.storage import Location
from hybridpar.errors import CheckpointDamagedError

logger = logging.getLogger("hybridpar")


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
    """Checks every state file against the manifest: its size, the index's SHA-256 (a few
    bytes per tensor, holding each tensor's CRC32C), and with ``deep`` every checksum.

    With ``deep`` a file with a SHA-256 in the manifest is read and hashed, and the
    data files of a format-2 checkpoint are checked by reading every tensor, which
    TensorFlow checks against the CRC32C in the index (``tensor_io.check_checksums``).

    Raises:
        CheckpointDamagedError: naming the first file that is missing or differs.
    """
    crc_checked = []
    for name, expected in sorted(manifest["files"].items()):
        file = storage.join(path, name)
        problem = file_problem(str(file), storage.size(file), expected)
        if problem is None and "sha256" in expected and (deep or name == INDEX_FILE):
            try:
                problem = hash_problem(str(file), storage.sha256_of(file)[1], expected)
            except FileNotFoundError:
                problem = f"{file} is missing"
        if problem:
            raise CheckpointDamagedError(problem)
        if expected.get("checksum") == CRC32C:
            crc_checked.append(name)
    if deep and crc_checked:
        # Imported here: the format's rules stay free of TensorFlow until a tensor is read.
        from hybridpar.checkpoint import tensor_io

        tensor_io.check_checksums(path, len(crc_checked))


def verify(path: str | os.PathLike, *, deep: bool = True) -> dict[str, Any]:
    """Reads a checkpoint's manifest and checks its state files against it.

    Args:
        deep: also check every file's checksum (reads each file once);
            otherwise sizes and the index's SHA-256 (TensorFlow checks each
            tensor's CRC32C as it restores it).

    Returns:
        The manifest.

    Raises:
        CheckpointDamagedError: saying what is missing, unreadable or does
            not match its checksum.
    """
    manifest = read_manifest(path)
    check_files(path, manifest, deep=deep)
    return manifest


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


def stale(directory: str | os.PathLike, keep: int) -> list[Location]:
    """The checkpoints beyond the newest ``keep``, oldest first (none when ``keep`` is 0)."""
    return list_checkpoints(directory)[:-keep] if keep > 0 else []

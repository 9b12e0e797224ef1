"""Publishing checkpoints atomically, and deleting them: what only the writing task does.

A checkpoint is written under ``.partial-...`` (``files.partial_for``) and
published only once complete: on a local filesystem the partial directory
is renamed into place; on other filesystems (``ram://``, ``gs://``,
``s3://``, where a directory rename is a copy or loses files) each file is
moved into ``ckpt-<step>/`` and the manifest last, so a checkpoint without
its manifest reads as damaged. Deletion (``prune``) is ordered the same
way, so a crash at any point leaves nothing that reads as a good checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from hybridpar.checkpoint import files, storage
from hybridpar.checkpoint.manifest import (
    MANIFEST_FILE,
    PARTIAL_PREFIX,
    ZERO_STAGING_PREFIX,
    checkpoint_name,
)
from hybridpar.checkpoint.storage import Location


def write_and_publish(directory: str | os.PathLike, manifest: dict[str, Any],
                      write: Callable[[Location], dict[str, Any]]) -> Location:
    """Writes checkpoint ``ckpt-<step>`` through a partial directory, then publishes it.

    Args:
        directory: the checkpoint directory.
        manifest: the manifest without ``files`` (it must hold ``step``).
        write: writes the state files into the partial directory it is given
            and returns their ``files`` entries (name -> size and checksum).

    Returns:
        The published checkpoint; an existing checkpoint of the same step is
        returned as it is, without writing.
    """
    final = storage.join(directory, checkpoint_name(int(manifest["step"])))
    if storage.exists(final):
        return final
    partial = files.partial_for(directory, int(manifest["step"]))
    storage.rmtree(partial)
    storage.makedirs(partial)
    try:
        entries = write(partial)
    except BaseException:
        storage.rmtree(partial)
        raise
    return publish(directory, partial, {**manifest, "files": entries})


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


def prune(directory: str | os.PathLike, keep: int) -> list[Location]:
    """Deletes all but the newest ``keep`` checkpoints; returns the deleted ones.

    Locally each is renamed to a ``.partial-`` name first, so a crash
    mid-delete leaves nothing that looks like a checkpoint; elsewhere its
    manifest goes first, which makes it read as damaged until it is gone.
    """
    stale = files.stale(directory, keep)
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
    """Removes unfinished writes left by a process that died (call on the writer only).

    These are partial checkpoints and workers' ZeRO shard bundles that no
    chief merged; call it before training starts, when no save is running.
    """
    for name in storage.listdir(directory):
        if name.startswith((PARTIAL_PREFIX, ZERO_STAGING_PREFIX)):
            storage.rmtree(storage.join(directory, name))

"""Format 1 (``hybridpar-checkpoint/1``): one ``state.npz`` per checkpoint, read and written.

hybridpar writes format 2 (``tensor_io``); checkpoints of older versions
still restore and resume, and the evaluator's watcher reads them whole.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

import numpy as np

from hybridpar.checkpoint import files, publication, storage
from hybridpar.checkpoint.manifest import (
    FORMAT,
    STATE_FILE,
    file_problem,
    hash_problem,
)
from hybridpar.checkpoint.storage import Location
from hybridpar.errors import CheckpointDamagedError


def load(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A format-1 checkpoint's manifest and arrays, checked and read from one read of ``state.npz``.

    Reading from the bytes that were checked means a checkpoint deleted
    meanwhile (``prune`` of another process) is either read whole or not at all.

    Raises:
        FileNotFoundError: when the checkpoint no longer exists.
        CheckpointDamagedError: as ``files.verify``.
    """
    state = storage.join(path, STATE_FILE)
    try:
        manifest = files.read_manifest(path)
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


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a format-1 checkpoint's ``state.npz`` (verify it first)."""
    with storage.open_file(storage.join(path, STATE_FILE), "rb") as stream:
        data = stream.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as state:
        return {key: state[key] for key in state.files}


def write(directory: str | os.PathLike, arrays: dict[str, np.ndarray],
          manifest: dict[str, Any]) -> Location:
    """Writes a format-1 checkpoint atomically (tests and tools make old checkpoints with it).

    ``manifest`` must hold ``step``; its ``format`` and ``files`` are filled in here.
    """
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()

    def write_state(partial: Location) -> dict[str, Any]:
        storage.write_bytes(storage.join(partial, STATE_FILE), data)
        return {STATE_FILE: {"bytes": len(data), "sha256": _sha256(data)}}

    return publication.write_and_publish(directory, {**manifest, "format": FORMAT}, write_state)

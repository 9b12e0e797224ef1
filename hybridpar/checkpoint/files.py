"""The checkpoint format on disk: names, manifests, checksums, atomic writes (numpy only).

A checkpoint is a directory ``<dir>/ckpt-<optimizer step, 8 digits>/`` with

- ``state.npz``: one array per variable, in three groups: ``model``,
  ``optimizer`` and ``metrics`` (``hybridpar.checkpoint.model_state`` says
  what each holds);
- ``manifest.json``: the optimizer step, the epoch and the batch within it
  to resume at, the data position, the config and topology that wrote it,
  the path/shape/dtype of every variable, and the byte size and SHA-256 of
  ``state.npz``.

A checkpoint is written under ``.partial-...`` and renamed into place only
once complete, so a crash mid-write never damages an earlier one; a damaged
checkpoint (truncated, edited, missing its manifest) fails its checksum and
the previous one is used.

When ``fit`` ends, the chief also writes ``<dir>/training-end.json`` naming
the final checkpoint (the evaluator stops after it); a new ``fit`` removes
it. Directories without it (written before it existed) read as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from hybridpar.errors import CheckpointDamagedError, ConfigError

logger = logging.getLogger("hybridpar")

FORMAT = "hybridpar-checkpoint/1"
STATE_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
GROUPS = ("model", "optimizer", "metrics")
END_FILE = "training-end.json"
END_FORMAT = "hybridpar-training-end/1"
_NAME_RE = re.compile(r"^ckpt-(\d{8,})$")
_PARTIAL_PREFIX = ".partial-"
_MAX_LISTED = 8


def checkpoint_name(step: int) -> str:
    """``ckpt-00000123`` for step 123."""
    return f"ckpt-{step:08d}"


def step_of(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint directory's name, or ``None`` if it is not one."""
    match = _NAME_RE.match(Path(path).name)
    return int(match[1]) if match else None


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Finished checkpoint directories under ``directory``, oldest step first.

    Unfinished writes (``.partial-*``) are never listed; damage is only
    found by ``verify``.
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir()]
    return sorted(found, key=step_of)


def sha256_of(path: Path) -> str:
    with open(path, "rb") as stream:
        return sha256_of_stream(stream)


def sha256_of_stream(stream: BinaryIO, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    while block := stream.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointDamagedError(f"{path} has no {MANIFEST_FILE}") from None
    except (OSError, ValueError) as err:
        raise CheckpointDamagedError(f"{path}/{MANIFEST_FILE} is unreadable ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointDamagedError(
            f"{path}/{MANIFEST_FILE} is not a {FORMAT} manifest "
            f"(format: {manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    return manifest


def _check_state(state: Path, stream: BinaryIO, manifest: dict[str, Any]) -> None:
    """Checks the open state file against its manifest's size and SHA-256."""
    expected = manifest["files"][STATE_FILE]
    size = os.fstat(stream.fileno()).st_size
    if size != expected["bytes"]:
        raise CheckpointDamagedError(
            f"{state} has {size} bytes, the manifest says {expected['bytes']} (truncated?)"
        )
    actual = sha256_of_stream(stream)
    if actual != expected["sha256"]:
        raise CheckpointDamagedError(
            f"{state} has SHA-256 {actual[:12]}..., the manifest says {expected['sha256'][:12]}..."
        )


def verify(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a checkpoint's manifest and checks its state file against it.

    Returns:
        The manifest.

    Raises:
        CheckpointDamagedError: saying what is missing, unreadable or does
            not match its checksum.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    state = path / STATE_FILE
    try:
        with open(state, "rb") as stream:
            _check_state(state, stream, manifest)
    except FileNotFoundError:
        raise CheckpointDamagedError(f"{state} is missing") from None
    return manifest


def load(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A checkpoint's manifest and arrays, checked and read from one open state file.

    Reading from the file that was checked means a checkpoint deleted
    meanwhile (``prune`` of another process) is either read whole or not at all.

    Raises:
        FileNotFoundError: when the checkpoint no longer exists.
        CheckpointDamagedError: as ``verify``.
    """
    path = Path(path)
    state = path / STATE_FILE
    try:
        manifest = _read_manifest(path)
        with open(state, "rb") as stream:
            _check_state(state, stream, manifest)
            stream.seek(0)
            with np.load(stream, allow_pickle=False) as arrays:
                return manifest, {key: arrays[key] for key in arrays.files}
    except (CheckpointDamagedError, FileNotFoundError) as err:
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {path} no longer exists") from None
        if isinstance(err, FileNotFoundError):
            raise CheckpointDamagedError(f"{state} is missing") from None
        raise


@dataclasses.dataclass(frozen=True)
class Found:
    """The newest undamaged checkpoint, and the damaged ones skipped to reach it."""

    path: Path
    manifest: dict[str, Any]
    skipped: tuple[tuple[Path, str], ...] = ()

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


def latest(directory: str | os.PathLike) -> Found | None:
    """The newest checkpoint in ``directory`` that passes ``verify``.

    Each damaged checkpoint on the way is logged (what is wrong, which one
    is used instead) and listed in ``Found.skipped``.

    Returns:
        ``None`` when ``directory`` holds no checkpoint at all.

    Raises:
        CheckpointDamagedError: when there are checkpoints but every one is
            damaged (training from scratch would silently lose them).
    """
    skipped: list[tuple[Path, str]] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            manifest = verify(path)
        except CheckpointDamagedError as err:
            logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous one.",
                           path.name, err)
            skipped.append((path, str(err)))
            continue
        if skipped:
            logger.warning("hybridpar: using checkpoint %s (step %s) instead of the damaged %s.",
                           path.name, manifest["step"], ", ".join(p.name for p, _ in skipped))
        return Found(path, manifest, tuple(skipped))
    if skipped:
        reasons = "; ".join(reason for _, reason in skipped)
        raise CheckpointDamagedError(
            f"every checkpoint in {directory} is damaged ({reasons}). Move them away to train "
            "from scratch, or point checkpoint.dir at a directory with a good checkpoint."
        )
    return None


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


def mismatch_message(path: Path, group: str, lines: Sequence[str]) -> str:
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
        return f"parameter_server, {workers} training task(s) (chief and workers)"
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(directory: str | os.PathLike, arrays: dict[str, np.ndarray],
          manifest: dict[str, Any]) -> Path:
    """Writes one checkpoint atomically: a partial directory renamed into place.

    ``manifest`` must hold ``step``; its ``files`` entry is filled in here.
    An existing checkpoint of the same step is kept as it is.
    """
    root = Path(directory)
    final = root / checkpoint_name(int(manifest["step"]))
    if final.exists():
        return final
    partial = root / f"{_PARTIAL_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        state = partial / STATE_FILE
        with open(state, "wb") as stream:
            np.savez(stream, **arrays)
            stream.flush()
            os.fsync(stream.fileno())
        files = {STATE_FILE: {"bytes": state.stat().st_size, "sha256": sha256_of(state)}}
        text = json.dumps({**manifest, "format": FORMAT, "files": files}, indent=1)
        with open(partial / MANIFEST_FILE, "w") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        _fsync_dir(partial)
        os.rename(partial, final)
        _fsync_dir(root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Deletes all but the newest ``keep`` checkpoints; returns the deleted ones.

    Each is renamed to a ``.partial-`` name first, so a crash mid-delete
    leaves nothing that looks like a checkpoint.
    """
    stale = list_checkpoints(directory)[:-keep] if keep > 0 else []
    for path in stale:
        doomed = path.with_name(f"{_PARTIAL_PREFIX}deleted-{path.name}-{os.getpid()}")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return stale


def remove_partials(directory: str | os.PathLike) -> None:
    """Removes unfinished writes left by a process that died (call on the writer only)."""
    root = Path(directory)
    if root.is_dir():
        for path in root.glob(f"{_PARTIAL_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)


def write_end(directory: str | os.PathLike, *, step: int, epoch: int, epochs: int) -> Path:
    """Records in ``directory`` that ``fit`` ended, with its final checkpoint (chief only).

    Args:
        step: the optimizer step of the final checkpoint (``ckpt-<step>``).
        epoch: the epochs completed.
        epochs: the ``epochs`` that ``fit`` was given.

    The record is written to a partial file and renamed into place.
    """
    root = Path(directory)
    record = {"format": END_FORMAT, "step": step, "checkpoint": checkpoint_name(step),
              "epoch": epoch, "epochs": epochs, "created": time.time()}
    partial = root / f"{_PARTIAL_PREFIX}{END_FILE}-{os.getpid()}"
    with open(partial, "w") as stream:
        stream.write(json.dumps(record, indent=1))
        stream.flush()
        os.fsync(stream.fileno())
    final = root / END_FILE
    os.replace(partial, final)
    _fsync_dir(root)
    return final


def read_end(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The record ``write_end`` left in ``directory``, or ``None`` while training goes on."""
    try:
        record = json.loads((Path(directory) / END_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("hybridpar: %s in %s is unreadable (%s); ignoring it.", END_FILE,
                       directory, err)
        return None
    return record if isinstance(record, dict) and record.get("format") == END_FORMAT else None


def remove_end(directory: str | os.PathLike) -> None:
    """Removes the end record when a new ``fit`` starts (chief only)."""
    with contextlib.suppress(FileNotFoundError):
        (Path(directory) / END_FILE).unlink()


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a checkpoint's state file (verify it first)."""
    with np.load(Path(path) / STATE_FILE, allow_pickle=False) as state:
        return {key: state[key] for key in state.files}


def ensure_writable(directory: str | os.PathLike, key: str = "checkpoint.dir") -> Path:
    """Creates ``directory`` if needed and proves it can be written.

    Raises:
        ConfigError: naming the key, the directory and the OS error.
    """
    path = Path(directory)
    probe = path / f".hybridpar-write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"{key}={str(directory)!r} is not a writable directory "
            f"({err.strerror or err}). Choose a directory this process can create and "
            "write, before training starts."
        ) from None
    return path

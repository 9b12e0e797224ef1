"""Watching a checkpoint directory for new checkpoints, as the evaluator task does.

The chief writes ``ckpt-<step>`` directories (atomically) into
``checkpoint.dir``, deletes all but the newest ``checkpoint.keep`` and, when
``fit`` ends, writes ``training-end.json`` naming the final checkpoint
(``end_record``). ``CheckpointWatcher.events`` yields every checkpoint
newer than the last one it yielded, oldest first, read whole; one deleted by
keep-N before it was read, or damaged, is reported instead. It ends once the
checkpoint named by the end record has been handled.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from hybridpar.checkpoint import end_record, files, npz, storage
from hybridpar.checkpoint.manifest import END_FILE, FORMAT, checkpoint_name
from hybridpar.errors import CheckpointDamagedError, ConfigError

logger = logging.getLogger("hybridpar")


@dataclasses.dataclass(frozen=True)
class Event:
    """What the watcher found at one checkpoint.

    Attributes:
        kind: ``checkpoint`` (read whole), ``deleted`` (gone before it was
            read: ``checkpoint.keep`` pruned it) or ``damaged``.
        path: the checkpoint directory.
        manifest: its manifest (``checkpoint`` only).
        arrays: its values (``checkpoint`` only).
        reason: what is damaged (``damaged`` only).
    """

    kind: Literal["checkpoint", "deleted", "damaged"]
    path: Path
    manifest: dict[str, Any] | None = None
    arrays: dict[str, np.ndarray] | None = None
    reason: str = ""

    @property
    def step(self) -> int:
        return files.step_of(self.path)


def _load(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A checkpoint's manifest and model weights as host arrays (either format)."""
    manifest = files.read_manifest(path)
    if manifest["format"] == FORMAT:
        return npz.load(path)
    files.check_files(path, manifest)
    import tensorflow as tf  # format 2 is read by TensorFlow

    from hybridpar.checkpoint import tensor_io

    try:
        return manifest, tensor_io.arrays_of(path, manifest["variables"], ["model"])
    except tf.errors.OpError as err:
        raise CheckpointDamagedError(f"{path}: {err.message.splitlines()[0]}") from None


def read(path: Path) -> Event:
    """One checkpoint as an ``Event``: its weights read whole, or why they cannot be."""
    try:
        manifest, arrays = _load(path)
    except FileNotFoundError:
        return Event("deleted", path)
    except CheckpointDamagedError as err:
        if not storage.isdir(path):
            return Event("deleted", path)
        return Event("damaged", path, reason=str(err))
    return Event("checkpoint", path, manifest, arrays)


def position(manifest: dict[str, Any]) -> str:
    """``end of epoch 2`` or ``epoch 3, after batch 5``: where in training it was written."""
    data = manifest.get("data", {})
    epoch, batch = int(data.get("epoch", 0)), int(data.get("batch", 0))
    return f"end of epoch {epoch}" if batch == 0 else f"epoch {epoch + 1}, after batch {batch}"


def epoch_index(manifest: dict[str, Any]) -> int:
    """The 0-based epoch a checkpoint belongs to, as Keras's ``History.epoch`` counts.

    A checkpoint written at the end of epoch ``k`` (1-based) belongs to
    index ``k - 1``, the entry of that epoch in the chief's own History; one
    written inside an epoch belongs to that epoch.
    """
    data = manifest.get("data", {})
    epoch, batch = int(data.get("epoch", 0)), int(data.get("batch", 0))
    return max(epoch - 1, 0) if batch == 0 else epoch


def check_readable(directory: Path) -> None:
    """Fails early when ``directory`` cannot be listed and read, now or once it exists.

    A directory that does not exist yet is fine (the chief creates it) when
    its nearest existing ancestor is a directory this process can enter.

    Raises:
        ConfigError: naming ``checkpoint.dir``, the directory and the problem.
    """
    if storage.scheme(directory):  # gs://, s3://, ...: listing it is the check
        return
    problem = None
    try:
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        where = "it" if existing == directory else f"{existing}"
        if not existing.is_dir():
            problem = f"{where} is not a directory"
        elif not os.access(existing, os.R_OK | os.X_OK):
            problem = f"this process may not list and read {where}"
    except OSError as err:
        problem = f"{err.strerror or err}"
    if problem:
        raise ConfigError(
            f"The evaluator reads the chief's checkpoints from checkpoint.dir={str(directory)!r}, "
            f"but {problem}. Point checkpoint.dir at the directory the chief writes, readable "
            "from the evaluator's machine (shared storage), before the evaluator starts."
        )


class CheckpointWatcher:
    """The new checkpoints of one directory, oldest first, until training ends.

    Args:
        directory: ``checkpoint.dir``.
        poll_seconds: how often the directory is listed.
        timeout_seconds: raise ``TimeoutError`` after this long without a
            new checkpoint (``None``: wait until the end record).
        clock, sleep: time functions (tests pass their own).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        poll_seconds: float = 1.0,
        timeout_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.directory = storage.location(directory)
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self._clock, self._sleep = clock, sleep
        self.last_step = -1
        self._said: set[str] = set()

    def _say_once(self, message: str, *args: Any) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.info(message, *args)

    def _final_step(self, epochs: int | None) -> int | None:
        """The step of the final checkpoint, once the chief recorded that ``fit`` ended.

        An end record of a ``fit`` given other ``epochs`` than this one
        (a previous run in the same directory) does not count.
        """
        record = end_record.read(self.directory)
        if record is None:
            return None
        if epochs is not None and record.get("epochs") != epochs:
            self._say_once(
                "hybridpar: %s says fit(epochs=%s) ended at step %s; this fit has epochs=%s, "
                "so the evaluator waits for training to end with those.",
                END_FILE, record.get("epochs"), record.get("step"), epochs)
            return None
        return int(record["step"])

    def _timed_out(self, since: float) -> None:
        if self.timeout_seconds is not None and self._clock() - since > self.timeout_seconds:
            newest = checkpoint_name(self.last_step) if self.last_step >= 0 else "none yet"
            raise TimeoutError(
                f"No new checkpoint appeared in {self.directory} for {self.timeout_seconds:g} s "
                f"(evaluator.timeout_seconds; the newest seen: {newest}), and the chief has not "
                "recorded the end of training. Check that the chief is training with "
                "checkpoint.dir set, or raise evaluator.timeout_seconds (null waits until the end)."
            )

    def events(self, epochs: int | None = None) -> Iterator[Event]:
        """Every checkpoint newer than the last one yielded, until the final one.

        Args:
            epochs: the ``epochs`` of the evaluator's ``fit``; the end record
                must name the same (``None``: any).

        Raises:
            TimeoutError: after ``timeout_seconds`` without a new checkpoint.
        """
        since = self._clock()
        while True:
            final = self._final_step(epochs)  # read before listing: its checkpoint is listed
            fresh = [p for p in files.list_checkpoints(self.directory)
                     if files.step_of(p) > self.last_step]
            if not fresh and self.last_step < 0 and final is None:
                self._say_once("hybridpar: evaluator waiting for the first checkpoint in %s",
                               self.directory)
            for path in fresh:
                self.last_step = files.step_of(path)
                yield read(path)
                since = self._clock()
            if final is not None:
                if self.last_step < final:
                    logger.warning("hybridpar: the final checkpoint %s named by %s is missing; "
                                   "the evaluator stops at %s.", checkpoint_name(final),
                                   END_FILE, checkpoint_name(self.last_step))
                return
            self._timed_out(since)
            self._sleep(self.poll_seconds)

    def newest(self) -> Event:
        """The newest checkpoint that can be read, waiting for a first one if there is none.

        Damaged or deleted ones on the way are logged and skipped, as
        ``files.latest`` does.

        Raises:
            CheckpointDamagedError: when every checkpoint is damaged.
            TimeoutError: after ``timeout_seconds`` without any checkpoint.
        """
        since = self._clock()
        while True:
            skipped = []
            for path in reversed(files.list_checkpoints(self.directory)):
                event = read(path)
                if event.kind == "checkpoint":
                    return event
                if event.kind == "damaged":
                    logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous "
                                   "one.", path.name, event.reason)
                    skipped.append(event.reason)
            if skipped:
                raise CheckpointDamagedError(
                    f"every checkpoint in {self.directory} is damaged ({'; '.join(skipped)})."
                )
            self._say_once("hybridpar: evaluator waiting for the first checkpoint in %s",
                           self.directory)
            self._timed_out(since)
            self._sleep(self.poll_seconds)

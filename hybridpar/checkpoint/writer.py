"""Checkpoint files written off the training path: one background write at a time.

``PeriodicCheckpoint`` snapshots a checkpoint's values in the training loop
(tensors on the variables' own devices, ``tensor_io.snapshot``; every
worker takes part, and that is the only part that blocks a step) and hands
them to a ``BackgroundWriter``, which in a thread has each task write its
data file, merges the index, records every file's size and checksum (the
index's SHA-256, the CRC32C SaveV2 computed as it wrote), writes the
manifest, publishes the partial directory and prunes old checkpoints
(``model_state.write``, ``publication.prune``). TensorFlow
copies a variable's buffer before updating it while a read of it is alive,
so training on does not change the snapshot.

- One snapshot is alive at a time: ``submit`` waits for the previous write
  before the next snapshot is taken.
- ``wait()`` blocks until the write in flight is done; the callback calls it
  at the end of ``fit`` and before a preemption exit. The thread is not a
  daemon, so a process that exits normally finishes the write first.
- A write that fails (a full disk, an I/O error) leaves the previous
  checkpoint as it was (the new one was still a ``.partial-`` directory) and
  is logged when it happens; the next ``submit`` or ``wait`` raises
  ``CheckpointWriteError`` with the cause, so training stops instead of
  running on without checkpoints. A process killed mid-write leaves only a
  partial directory, removed when the next run starts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from hybridpar.checkpoint import files, publication, storage
from hybridpar.checkpoint.manifest import checkpoint_name
from hybridpar.errors import CheckpointWriteError

logger = logging.getLogger("hybridpar")


class BackgroundWriter:
    """Writes checkpoints in a background thread, one at a time (see the module doc)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: CheckpointWriteError | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """True while a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, directory: str | os.PathLike, step: int,
               write: Callable[[], Any], keep: int) -> Any:
        """Starts ``write()`` of checkpoint ``step`` (the previous write has finished:
        call ``wait`` before taking the snapshot that ``write`` writes).

        Returns:
            The checkpoint directory the write will create.

        Raises:
            CheckpointWriteError: if the previous write failed.
        """
        self.wait()
        path = storage.join(directory, checkpoint_name(step))
        self._thread = threading.Thread(
            target=self._write, args=(directory, step, write, keep),
            name=f"hybridpar-checkpoint-{checkpoint_name(step)}", daemon=False,
        )
        self._thread.start()
        return path

    def wait(self) -> None:
        """Blocks until the write in flight is done.

        Raises:
            CheckpointWriteError: if that write (or an earlier unreported one) failed.
        """
        thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _write(self, directory: str | os.PathLike, step: int, write: Callable[[], Any],
               keep: int) -> None:
        name = checkpoint_name(step)
        try:
            write()
            publication.prune(directory, keep)
        except Exception as err:  # reported to the training thread, never dropped
            previous = [storage.name(p) for p in files.list_checkpoints(directory)]
            intact = f"the newest complete one is {previous[-1]}" if previous else "none exists"
            message = (getattr(err, "message", None) or str(err)).splitlines()[0]
            failure = CheckpointWriteError(
                f"Writing checkpoint {name} in {directory} failed in the background "
                f"({type(err).__name__}: {message}). Earlier checkpoints are intact ({intact}). "
                "Free space or fix the directory, then resume from the newest checkpoint."
            )
            failure.__cause__ = err
            logger.error("hybridpar: %s", failure)
            with self._lock:
                self._failure = failure

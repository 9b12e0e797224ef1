"""The record of ``fit``'s end: ``<dir>/training-end.json``, naming the final checkpoint.

When ``fit`` ends on a cluster with an evaluator, the chief writes it once
the final checkpoint is on disk, so the evaluator knows which checkpoint is
the last and stops after it; a new ``fit`` removes it. Directories without
it (written before it existed) read as before.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from hybridpar.checkpoint import storage
from hybridpar.checkpoint.manifest import END_FILE, END_FORMAT, PARTIAL_PREFIX, checkpoint_name
from hybridpar.checkpoint.storage import Location

logger = logging.getLogger("hybridpar")


def write(directory: str | os.PathLike, *, step: int, epoch: int, epochs: int) -> Location:
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


def read(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The record ``write`` left in ``directory``, or ``None`` while training goes on."""
    try:
        record = json.loads(storage.read_text(storage.join(directory, END_FILE)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("hybridpar: %s in %s is unreadable (%s); ignoring it.", END_FILE,
                       directory, err)
        return None
    return record if isinstance(record, dict) and record.get("format") == END_FORMAT else None


def remove(directory: str | os.PathLike) -> None:
    """Removes the end record when a new ``fit`` starts (chief only)."""
    storage.remove(storage.join(directory, END_FILE))

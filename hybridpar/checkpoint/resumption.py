"""Choosing and restoring the checkpoint a ``fit`` resumes from.

The newest undamaged checkpoint is chosen (the chief's choice on every
worker when the policy is coordinated, ``coordination``) and restored. One
that proves damaged only as it is read (TensorFlow's CRC32C check of a
tensor, where the choice did not read every tensor first: one process, the
ps) falls back to the previous one, unless every worker must restore the same
one.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hybridpar.checkpoint import coordination, files, input_state, model_state, storage
from hybridpar.checkpoint.files import Found
from hybridpar.checkpoint.policy import SavePolicy
from hybridpar.errors import CheckpointDamagedError

logger = logging.getLogger("hybridpar")


def choose(directory: str | os.PathLike, policy: SavePolicy, *, is_chief: bool,
           task: str) -> Found | None:
    """The checkpoint to restore, or ``None`` when ``directory`` holds none yet."""
    return coordination.choose(directory, coordinated=policy.coordinated, is_chief=is_chief,
                               task=task, deep=policy.deep)


def apply(model: Any, directory: str | os.PathLike, found: Found, policy: SavePolicy,
          share: tuple[int, int] | None = None,
          worker: int = 0) -> tuple[Found, model_state.Reader, bool, Any]:
    """Restores ``found`` (or, if it proves damaged, the newest older one) into ``model``.

    Args:
        share: ``(this worker, workers)`` where every worker restores the chief's choice
            (``policy.coordinated``): each reads its share (``shared_restore``).
        worker: this worker's index, whose saved input state is read.

    Returns:
        The checkpoint restored, its reader (for the metrics), whether its metrics
        are still to be assigned (Keras resets metrics when the epoch begins), and
        this worker's saved input state (``input_state.read``; ``None`` if none).

    Raises:
        CheckpointDamagedError: when no checkpoint could be read, or the one
            every worker restores could not.
    """
    while True:
        values = model_state.reader(found.path, found.manifest)
        try:
            pending = model_state.apply(model, found.path, found.manifest, values,
                                        metrics=False, share=share)
            saved_input = input_state.read(values, found.path, found.manifest, worker)
            return found, values, pending, saved_input
        except CheckpointDamagedError as err:
            if policy.coordinated:
                raise  # every worker must restore the same one
            logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous "
                           "one.", storage.name(found.path), err)
            previous = files.latest(directory, deep=policy.deep, below=found.step)
            if previous is None:
                raise
            found = Found(previous.path, previous.manifest,
                          (*found.skipped, (found.path, str(err)), *previous.skipped))

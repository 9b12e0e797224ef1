"""The training input's position in checkpoints: each worker saves its own iterator's state.

With ``checkpoint.save_iterator`` (the default) ``fit`` reads its training
input through one ``hybridpar.data.resumable.ResumableIterator`` per worker.
Each save records that iterator's state (the pipeline's position and its
buffers) as the string tensor ``input/<worker>`` on the worker's host, beside
the variables (a non-chief worker writes it in its own bundle, ``zero_shards``),
with the structural digest of that worker's pipeline
(``hybridpar.data.pipeline_digest``) as ``input/<worker>/digest``: workers may
read other pipelines (each its own copy of the files). The manifest's
``data.input_state`` says for which input (its ``fingerprint``: workers,
replicas, sharding, pieces). A resume restores the state into the first
iterator of the resumed epoch, so no batch is replayed, whatever the step. A
pipeline changed since the checkpoint (another digest) is replayed instead,
with a warning; a state saved without a digest (by an earlier hybridpar) is
restored as before. A restored iterator with nothing after the saved position,
where the epoch goes on (``steps``), raises ``InputPositionError`` at fit's
first step rather than train nothing. A pipeline with stateful ops other than
Python ones (a random op in a ``map``, Keras's shuffle of in-memory arrays) is
saved without those ops' own state, and the log says so once. Where the state
cannot serve (a pipeline with a Python generator or function; a checkpoint of
another topology or input; one written without it; a state that does not fit
the pipeline, after which the iterator is put back at its start), the batches
already trained are drawn again (``skipping``) and the log says why, once. A
saved state that fails its CRC32C makes the checkpoint damaged (``read``), like
any other tensor of it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hybridpar.checkpoint import tensor_io
from hybridpar.data import resumable
from hybridpar.errors import CheckpointDamagedError, InputPositionError

logger = logging.getLogger("hybridpar")

GROUP = "input"
RECORD = "input_state"  # the key of the manifest's ``data`` that describes the saved state


def key(worker: int) -> str:
    """The tensor holding worker ``worker``'s iterator state."""
    return f"{GROUP}/{worker:05d}"


def digest_key(worker: int) -> str:
    """The tensor holding the structural digest of worker ``worker``'s pipeline."""
    return f"{key(worker)}/digest"


@dataclasses.dataclass(frozen=True)
class SavedInput:
    """A worker's saved input: its iterator's ``state`` and its pipeline's ``digest``
    (``None`` in a checkpoint written before digests were saved)."""

    state: Any
    digest: str | None


def _first_line(err: Exception) -> str:
    return str(getattr(err, "message", err)).splitlines()[0]


# A Python function's state (a generator's position) is not in the iterator's: a state saved
# without it would restart the generator at the saved position's element count, silently.
_PYTHON_STATE = ("PyFunc", "EagerPyFunc", "generator")


class InputSaver:
    """Captures the iterator's state at each save. Each pipeline's kind is said once: one
    that cannot be saved (a Python generator or function) is then left alone; one whose
    stateful ops are saved without their own state (random ops) is saved so."""

    def __init__(self) -> None:
        self.unsaveable: str | None = None
        self.external_state: str | None = None
        self._sized = False

    def capture(self, iterator: Any, worker: int) -> tuple[list[tensor_io.Piece],
                                                           dict[str, Any] | None]:
        """The pieces holding ``iterator``'s state and its pipeline's digest, and the
        manifest's record of them, or nothing for an iterator that is not resumable or
        cannot be saved."""
        if not isinstance(iterator, resumable.ResumableIterator) or self.unsaveable:
            return [], None
        try:
            state = iterator.state(external_state=self.external_state is not None)
        except tf.errors.FailedPreconditionError as err:
            reason = _first_line(err)
            if any(word in reason for word in _PYTHON_STATE):
                self.unsaveable = reason
                logger.warning(
                    "hybridpar: the training input's position cannot be saved with the "
                    "checkpoints (%s): a resume will draw the batches already trained again. "
                    "A pipeline of tf.data operations (no Python generator or py_function) is "
                    "resumed without that.", reason)
                return [], None
            self.external_state = reason
            logger.warning(
                "hybridpar: the training input is saved with the checkpoints without the "
                "state of its stateful ops (%s): a resume continues at the saved position, "
                "with its buffers, but such an op (a random op in a map, Keras's shuffle of "
                "in-memory arrays) draws other values than the uninterrupted run would. "
                "Stateless ops (tf.random.stateless_*, a seeded shuffle) resume exactly.",
                reason)
            state = iterator.state(external_state=True)
        if not self._sized:
            self._sized = True
            logger.info("hybridpar: each checkpoint saves the training input's position with "
                        "its buffers: %s bytes on this worker.", f"{len(state.numpy()):,}")
        return ([tensor_io.Piece(key(worker), "", state),
                 tensor_io.Piece(digest_key(worker), "", tf.constant(iterator.dataset.digest))],
                {"fingerprint": iterator.dataset.fingerprint})


def read(reader: Any, path: Any, manifest: dict[str, Any], worker: int) -> SavedInput | None:
    """Worker ``worker``'s saved input, read with the rest of the checkpoint, so that a
    damaged one (TensorFlow checks its CRC32C as it reads it) makes the checkpoint damaged.

    Returns:
        The state and digest, or ``None`` when the checkpoint holds no state for this
        worker.

    Raises:
        CheckpointDamagedError: naming the checkpoint and the tensor.
    """
    if manifest["data"].get(RECORD) is None:
        return None
    state = _array(reader, path, key(worker))
    if state is None:
        return None  # a worker the saving run did not have: its fingerprint differs
    digest = _array(reader, path, digest_key(worker))
    if digest is not None:
        digest = (digest.item() if hasattr(digest, "item") else digest).decode()
    return SavedInput(state, digest)


def _array(reader: Any, path: Any, name: str) -> Any:
    """The string tensor ``name``, or ``None`` where the checkpoint has none."""
    try:
        return reader.array(name, "string")
    except (KeyError, tf.errors.NotFoundError):
        return None
    except tf.errors.OpError as err:
        raise CheckpointDamagedError(f"{os.fspath(path)}: {name} cannot be read "
                                     f"({_first_line(err)})") from None


def restorer(saved: SavedInput | None, manifest: dict[str, Any], worker: int,
             steps: int | None = None) -> Callable[[Any], bool]:
    """What puts the resumed epoch's first iterator where the checkpoint left it.

    Args:
        saved: this worker's saved input (``read``), or ``None``.
        manifest: the checkpoint's manifest.
        worker: this worker's index.
        steps: the steps of this fit's epochs, if known (Keras's ``steps``: the input's
            cardinality or ``steps_per_epoch``).

    Returns:
        A function that restores the saved state into a resumable iterator of the
        same input and returns ``True``; otherwise it says why once and returns
        ``False`` (the batches are then drawn again).

    Where the epoch goes on past the saved position, fit's first step after the restore
    raises ``InputPositionError`` if the restored iterator has nothing after it.
    """
    record = manifest["data"].get(RECORD)

    def restore(iterator: Any) -> bool:
        why = _not_restorable(iterator, record, saved, worker)
        if why is None:
            if _changed(saved, iterator):
                logger.warning(
                    "hybridpar: the training input's pipeline changed since the checkpoint "
                    "was written (its structural digest was %s, this fit's is %s): its saved "
                    "position is not restored, and the resumed epoch is replayed from its "
                    "start, drawing the batches already trained again without training on "
                    "them.", saved.digest[:12], iterator.dataset.digest[:12])
                return False
            why = _restored(saved.state, iterator, _goes_on(manifest, iterator, steps))
            if why is None:
                logger.info("hybridpar: restored the training input's position from the "
                            "checkpoint; no batch is drawn again.")
                return True
        logger.info("hybridpar: the batches already trained are drawn again: %s.", why)
        return False

    return restore


def _not_restorable(iterator: Any, record: dict[str, Any] | None, saved: SavedInput | None,
                    worker: int) -> str | None:
    """Why the saved state cannot serve ``iterator``, or ``None``."""
    if not isinstance(iterator, resumable.ResumableIterator):
        return ("this fit's input is read by TensorFlow's distributed iterator, which "
                "cannot be restored (checkpoint.save_iterator is false, or the input is "
                "not a tf.data dataset of batches)")
    if record is None:
        return "the checkpoint holds no state of the input's iterator"
    if record["fingerprint"] != iterator.dataset.fingerprint:
        return (f"its input's state was saved for {record['fingerprint']}, and this fit "
                f"reads {iterator.dataset.fingerprint}")
    if saved is None:
        return f"the checkpoint holds no state of worker {worker}'s iterator"
    return None


def _changed(saved: SavedInput, iterator: Any) -> bool:
    """Whether the pipeline's digest differs from the saved one (unknown: not changed)."""
    return saved.digest is not None and saved.digest != iterator.dataset.digest


def _goes_on(manifest: dict[str, Any], iterator: Any, steps: int | None) -> str | None:
    """Where the resumed epoch is known to go on past the saved position, that position in
    words; else ``None`` (the epoch's length is unknown, or this worker reads its own
    files, whose end may come before the others')."""
    data = manifest["data"]
    batch = int(data["batch"])
    if steps is None or batch >= steps or not iterator.layout.whole:
        return None
    return (f"batch {batch} of epoch {int(data['epoch']) + 1} (optimizer step "
            f"{manifest['step']}), of an epoch of {steps} steps")


def _restored(saved: Any, iterator: Any, goes_on: str | None) -> str | None:
    """Restores ``saved`` into ``iterator``; ``None``, or why not (the iterator is then put
    back at its start: a failed restore leaves it ended). Where the epoch goes on
    (``goes_on``), fit's first step after it raises ``InputPositionError`` if the input
    ends at once (``ResumableIterator.expect_steps_after_restore``)."""
    start = iterator.state(external_state=True)
    try:
        iterator.restore(saved)
    except tf.errors.OpError as err:
        iterator.restore(start)
        return f"the saved state does not fit this input's pipeline ({_first_line(err)})"
    if goes_on is not None:
        iterator.expect_steps_after_restore(lambda: _ended_error(goes_on))
    return None


def _ended_error(goes_on: str) -> InputPositionError:
    return InputPositionError(
        "hybridpar: the training input yields fewer batches than the checkpoint's "
        f"position: the checkpoint saved it at {goes_on}, and the restored iterator "
        "has no batch after it (an input changed in a way its structural digest does "
        "not see, such as a file's contents, or a checkpoint written before the digest "
        "was saved), so the resumed epoch would train nothing. Resume with the input "
        "the checkpoint was written with, or set checkpoint.save_iterator: false to "
        "draw the trained batches again from this input, or start afresh in an empty "
        "checkpoint.dir.")

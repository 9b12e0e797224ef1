"""The data position: the batches ``fit`` drew from its input, counted for a step-exact resume.

``DataPosition`` wraps ``model.train_function`` (Keras's trainer calls it
once per ``steps_per_execution`` batches) to count the batches drawn from
each iterator, to notice an iterator that spans epochs (``steps_per_epoch``
over a repeated dataset), to hand a save the iterator whose state it records
(``live_iterator``), and, on a resume, to put the first iterator where the
checkpoint left it: by restoring the saved state of its iterator where the
checkpoint holds it (``hybridpar.data.resumable``), else by drawing the
batches already trained without training on them (all of them at the first
call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class DataPosition:
    """Counts and skips the batches of ``model.train_function`` while installed.

    Args:
        draw: ``draw(iterator, count)`` takes ``count`` elements from the
            iterator without training on them (``skipping.draw``).
        epoch: the epoch ``fit`` is in now.
        before_step: called at each call, once the iterator is known and
            before any batch is drawn.
    """

    def __init__(self, draw: Callable[[Any, int], None], epoch: Callable[[], int],
                 before_step: Callable[[], None]) -> None:
        self._draw = draw
        self._epoch = epoch
        self._before_step = before_step
        self._iterator: Any = None
        self._iterator_epoch = 0
        self._position = 0
        self._persists = False
        self._skip_calls = self._skip_extra = self._drawn_ahead = 0
        self._per_call = 1
        self._restore: Callable[[Any], bool] | None = None
        self._restored = False
        self._model: Any = None
        self._original: Any = None

    def install(self, model: Any) -> None:
        """Wraps ``model.train_function`` (the one of this ``fit``)."""
        self._model, self._original = model, model.train_function
        self._per_call = int(getattr(model, "steps_per_execution", 1) or 1)
        model.train_function = self._train_function

    def uninstall(self) -> None:
        """Puts the original ``train_function`` back; the counts stay for later saves."""
        if self._original is not None:
            self._model.train_function = self._original
        self._iterator = None

    def skip(self, batches: int, extra: int, persists: bool,
             restore: Callable[[Any], bool] | None = None, loop_skips: bool = False) -> None:
        """Plans a resume: skip ``batches`` of the epoch after ``extra`` drawn by earlier
        epochs of a persistent iterator.

        Args:
            restore: puts the first iterator at that position from the checkpoint's saved
                state, returning ``False`` where it cannot (the batches are drawn then).
            loop_skips: ``fit``'s loop begins the epoch at ``batches`` itself; otherwise
                the first ``batches`` calls (whole ones) train nothing.
        """
        self._skip_calls = 0 if loop_skips else batches // self._per_call
        self._skip_extra = extra + (batches if loop_skips else 0)
        self._persists = persists
        self._restore = restore

    @property
    def skipping(self) -> bool:
        """True while batches planned by ``skip`` are still to be skipped."""
        return bool(self._skip_calls or self._skip_extra)

    def _current(self, epoch: int) -> bool:
        return epoch == self._iterator_epoch or self._persists

    def record(self, epoch: int, batch: int) -> dict[str, Any]:
        """The manifest's ``data`` for a save at ``batch`` of ``epoch``."""
        return {"epoch": epoch, "batch": batch,
                "iterator_position": self._position if self._current(epoch) else 0,
                "iterator_persists": self._persists}

    def live_iterator(self, epoch: int) -> Any:
        """The iterator a save at ``epoch`` resumes from, or ``None`` when that is a fresh
        one (the epoch's iterator is not drawn yet)."""
        return self._iterator if self._iterator is not None and self._current(epoch) else None

    def _train_function(self, iterator: Any) -> Any:
        epoch = self._epoch()
        if iterator is not self._iterator:
            if self._iterator is not None:
                self._persists = False
            self._iterator, self._iterator_epoch, self._position = iterator, epoch, 0
        elif self._iterator_epoch != epoch:
            self._persists = True
        self._before_step()
        ahead = self._skip_extra + self._skip_calls * self._per_call - self._drawn_ahead
        if ahead > 0:  # every batch to skip, at the first call: restored, or in one graph loop
            self._restored = self._restore is not None and self._restore(iterator)
            if not self._restored:
                self._draw(iterator, ahead)
            self._position += ahead
            self._drawn_ahead += ahead
        self._restore = None
        self._skip_extra = 0
        if self._skip_calls:
            self._skip_calls -= 1
            return {}
        if self._restored:  # the iterator checks that the restored input goes on
            self._restored = False
            result = iterator.first_step_after_restore(self._original)
        else:
            result = self._original(iterator)
        self._position += self._per_call
        return result

"""How checkpoints are taken and resumed under synchronous or parameter-server training.

``PeriodicCheckpoint`` decides when a save is due; its ``SavePolicy``, chosen
once from the strategy (``policy_for``), says what that means here:

- ``SynchronousPolicy`` (one device, mirrored, multi-worker): every step is
  one state of every worker. Saves fall on ``every_steps``; an epoch's save
  is written just before the next epoch's first step (or when ``fit``
  ends), once it is known whether that epoch draws from a fresh iterator;
  the data position is counted (``position``) and a resume skips the
  batches already trained. Every worker restores the chief's choice.
- ``ParameterServerPolicy``: steps run asynchronously on the workers, so a
  step count names no consistent state: only epochs are saved, after the
  coordinator joined every step, and the save is waited for (the snapshot
  lives on the ps tasks). The preemption watcher counts a step before it
  is scheduled, and a resume continues inside the saved epoch when its
  length is unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from hybridpar.checkpoint.manifest import asynchronous_resume, resume_plan
from hybridpar.checkpoint.position import DataPosition

logger = logging.getLogger("hybridpar")

Save = Callable[..., Any]  # ``PeriodicCheckpoint.save``
Draw = Callable[[Any, int], None]  # ``skipping.draw``: TensorFlow stays out of this module


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a restored ``fit`` continues, and how the log says it."""

    epoch: int
    where: str  # follows "resumed from <path> at optimizer step <n>"
    batch: int = 0  # the first step of the epoch that the fit loop runs
    inside: bool = False  # inside the saved epoch: its running metrics are restored too


class SavePolicy(abc.ABC):
    """What differs between the kinds of training; the callback's hooks call these."""

    #: the manifest's topology records the ps tasks
    asynchronous: ClassVar[bool]
    #: choosing a checkpoint reads every tensor first, so TensorFlow checks its CRC32C
    #: (``files.verify``); else the restore checks each tensor as it reads it
    deep: bool

    def __init__(self, save: Save, *, coordinated: bool = False) -> None:
        self._save = save
        self.coordinated = coordinated  # every worker must restore the chief's choice

    @abc.abstractmethod
    def begin(self, model: Any) -> None:
        """When ``fit`` starts, before the restore."""

    @abc.abstractmethod
    def end(self) -> None:
        """When ``fit`` ends, after the last save."""

    @abc.abstractmethod
    def step_begins(self, watcher: Any) -> None:
        """Before a step is run or scheduled (``watcher``: the preemption watcher or ``None``)."""

    @abc.abstractmethod
    def step_ended(self, watcher: Any, save_if_due: Callable[[], None]) -> None:
        """After a step; ``save_if_due`` saves when ``every_steps`` says so."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Writes a save still held back, when ``fit`` ends."""

    @abc.abstractmethod
    def epoch_ended(self) -> None:
        """An ``every_epochs``-th epoch ended: save it."""

    @abc.abstractmethod
    def data(self, epoch: int, batch: int, steps: int | None) -> dict[str, Any]:
        """The manifest's ``data`` for a save at ``batch`` of ``epoch``."""

    @abc.abstractmethod
    def live_iterator(self, epoch: int) -> Any:
        """The input iterator whose state a save at ``epoch`` records, if any."""

    @abc.abstractmethod
    def resume(self, model: Any, manifest: dict[str, Any], steps: int | None,
               restore_input: Callable[[Any], bool] | None = None,
               start_at: Callable[[int], bool] | None = None) -> Resume:
        """Plans the continuation from a restored checkpoint's ``manifest``.

        Args:
            restore_input: puts the resumed input iterator where the checkpoint left it
                (``input_state.restorer``), ``False`` where it cannot.
            start_at: has ``fit``'s loop begin the resumed epoch at a batch, ``False``
                where it cannot (the trainer's ``start_next_epoch_at``).
        """


class SynchronousPolicy(SavePolicy):
    """Step and epoch saves of synchronous training, with the data position (module doc)."""

    asynchronous = False

    def __init__(self, save: Save, epoch: Callable[[], int], draw: Draw, *,
                 coordinated: bool) -> None:
        super().__init__(save, coordinated=coordinated)
        # Every worker restores the chief's choice, so the chief reads it whole first; one
        # worker reads it once, and a tensor that fails its CRC32C as it is restored falls
        # back to the previous checkpoint (``resumption.apply``).
        self.deep = coordinated
        self._epoch = epoch
        self._draw = draw
        self._epoch_save_pending = False
        self.position = self._new_position()

    def _new_position(self) -> DataPosition:
        return DataPosition(self._draw, self._epoch, self.flush)

    def begin(self, model: Any) -> None:
        self._epoch_save_pending = False
        self.position = self._new_position()
        self.position.install(model)

    def end(self) -> None:
        self.position.uninstall()

    def step_begins(self, watcher: Any) -> None:
        """Nothing: the watcher counts a step once it ran (``step_ended``)."""

    def step_ended(self, watcher: Any, save_if_due: Callable[[], None]) -> None:
        save_if_due()
        if watcher is not None:
            watcher.step_done()

    def epoch_ended(self) -> None:
        # Written before the next epoch's first step, once it is known whether that epoch
        # draws from a fresh iterator; the state is the same as now.
        self._epoch_save_pending = True

    def flush(self) -> None:
        if self._epoch_save_pending:
            self._epoch_save_pending = False
            self._save()

    def data(self, epoch: int, batch: int, steps: int | None) -> dict[str, Any]:
        return self.position.record(epoch, batch)

    def live_iterator(self, epoch: int) -> Any:
        return self.position.live_iterator(epoch)

    def resume(self, model: Any, manifest: dict[str, Any], steps: int | None,
               restore_input: Callable[[Any], bool] | None = None,
               start_at: Callable[[int], bool] | None = None) -> Resume:
        epoch, skip, extra = resume_plan(manifest, steps)
        loop_skips = bool(skip) and start_at is not None and start_at(skip)
        self.position.skip(skip, extra, bool(manifest["data"]["iterator_persists"]),
                           restore_input, loop_skips)
        return Resume(epoch, f" (epoch {epoch + 1}, continuing after its first {skip} "
                             f"batch(es), already trained)", batch=skip if loop_skips else 0,
                      inside=self.position.skipping)


class ParameterServerPolicy(SavePolicy):
    """Epoch saves, waited for, of parameter-server training (module doc)."""

    asynchronous = True
    deep = False  # the ps check their own reads (CRC32C)

    def __init__(self, save: Save, *, every_steps: int) -> None:
        super().__init__(save)
        if every_steps:
            logger.warning(
                "hybridpar: checkpoint.every_steps=%d is not applied in parameter-server mode "
                "(steps run asynchronously); checkpoints are written at epoch ends.",
                every_steps,
            )

    def begin(self, model: Any) -> None:
        """Nothing: the workers' input has no position to count."""

    def end(self) -> None:
        """Nothing was installed."""

    def step_begins(self, watcher: Any) -> None:
        if watcher is not None:
            watcher.step_done()  # before the step is scheduled: stop scheduling here

    def step_ended(self, watcher: Any, save_if_due: Callable[[], None]) -> None:
        """Nothing: a step count names no consistent state, so steps are not saved."""

    def flush(self) -> None:
        """Nothing is held back: epoch saves are written at once."""

    def epoch_ended(self) -> None:
        # The snapshot lives on the ps tasks, which write it: a ps lost in the next epoch
        # must not take this epoch's checkpoint with it, so training waits for the write.
        self._save(wait=True)

    def data(self, epoch: int, batch: int, steps: int | None) -> dict[str, Any]:
        # The workers' input has no position to record; the epoch's does.
        return {"epoch": epoch, "batch": batch, "iterator_position": batch,
                "iterator_persists": False, "steps_per_epoch": steps}

    def live_iterator(self, epoch: int) -> Any:
        """None: the workers' input starts again from its beginning."""
        return None

    def resume(self, model: Any, manifest: dict[str, Any], steps: int | None,
               restore_input: Callable[[Any], bool] | None = None,
               start_at: Callable[[int], bool] | None = None) -> Resume:
        """Inside the saved epoch, or at the next one."""
        epoch, batch, where = asynchronous_resume(manifest, steps)
        model._hybridpar_initial_batch = batch  # read by the parameter-server fit loop
        return Resume(epoch, f", {where}", batch=batch, inside=bool(batch))


def policy_for(state: Any, save: Save, epoch: Callable[[], int], draw: Draw,
               every_steps: int) -> SavePolicy:
    """The policy of the strategy ``state`` (a ``StrategyState`` or ``None``).

    Args:
        save: ``PeriodicCheckpoint.save``.
        epoch: the epoch ``fit`` is in now.
        draw: draws batches from an iterator without training on them.
        every_steps: ``checkpoint.every_steps`` (warned about where not applied).
    """
    if state is not None and state.mode == "parameter_server":
        return ParameterServerPolicy(save, every_steps=every_steps)
    cluster = state.cluster if state is not None else None
    return SynchronousPolicy(save, epoch, draw,
                             coordinated=cluster is not None and cluster.num_workers > 1)

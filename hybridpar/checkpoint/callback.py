"""``PeriodicCheckpoint``: the Keras callback behind ``checkpoint.*`` (save, resume, preempt)."""

from __future__ import annotations

import logging
from typing import Any

import keras
import tensorflow as tf

from hybridpar.checkpoint import (
    coordination,
    end_record,
    files,
    model_state,
    preemption,
    publication,
    skipping,
    storage,
    topology,
)
from hybridpar.checkpoint.manifest import END_FILE, asynchronous_resume, resume_plan
from hybridpar.checkpoint.writer import BackgroundWriter
from hybridpar.config import CheckpointConfig
from hybridpar.errors import CheckpointDamagedError, ConfigError
from hybridpar.state import StrategyState, state_of

logger = logging.getLogger("hybridpar")


def _state_from(hybrid: Any) -> StrategyState | None:
    """The strategy state behind ``hybrid`` (a ``HybridStrategy`` or a state), or in scope."""
    if hybrid is None:
        return state_of(tf.distribute.get_strategy())
    return hybrid if isinstance(hybrid, StrategyState) else hybrid.state


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Checkpoints from ``config.checkpoint``: periodic saves, step-exact resume, preemption.

    - Saves model, optimizer and metric variables with the epoch, the batch
      within it and the data position every ``every_steps`` optimizer steps
      and/or ``every_epochs`` epochs, keeping the newest ``keep``
      (``hybridpar.checkpoint.files`` describes the format). Every worker takes
      part in a save; only the chief writes files. A save blocks training
      only while the values are copied to host memory; the files are written
      in the background, one save at a time (``checkpoint.writer``), and the
      next save, the end of ``fit``, a preemption exit and process exit wait
      for the write in flight. A write that fails is logged and raised as
      ``CheckpointWriteError`` at the next save or the end of ``fit``.
    - With ``resume`` (``checkpoint.backup_and_restore``), ``fit`` first
      restores the newest undamaged checkpoint in ``dir`` and continues at
      its optimizer step: it starts at the saved epoch and skips the batches
      of that epoch that were already trained, by drawing them from the
      iterator without training on them. This reproduces the uninterrupted
      run when the data is deterministic: each epoch's iterator yields the
      same batches in the same order whatever ran before in the process
      (no shuffling, or ``shuffle(..., seed=..., reshuffle_each_iteration=False)``).
    - With ``preemption``, SIGTERM during ``fit`` makes every worker save at
      the same step boundary (the step after the next) and exit with
      ``PREEMPTED_EXIT_CODE`` (42). The SIGTERM handler is installed when
      ``fit`` starts and removed when it ends; if an exception escapes
      ``fit``, it stays until the next ``fit`` ends. Outside the main
      thread (Ray Train runs the training function in a thread) no handler
      can be installed: that is logged once, and restarts resume from the
      last periodic checkpoint.

    The callback works with any ``model.fit`` loop that calls
    ``model.train_function(iterator)`` once per ``steps_per_execution``
    batches (Keras's TensorFlow trainer does); a trainer with its own loop
    plugs in by doing the same.

    In parameter-server mode steps run asynchronously on the workers, so a
    step count does not name one consistent state: checkpoints are written at
    the end of each ``every_epochs``-th epoch (after the coordinator joined
    every step) and ``every_steps`` is not applied. SIGTERM on the chief
    stops the scheduling of steps, joins those in flight, saves the exact
    step count and the steps done in the epoch, and exits with
    ``PREEMPTED_EXIT_CODE``. A relaunch resumes inside that epoch when the
    checkpoint's epoch length matches this ``fit``'s ``steps_per_epoch``
    (each worker's input starts again from its beginning), else at the next
    epoch; the log says which.

    When the cluster has an ``evaluator`` task, ``fit``'s end is always
    checkpointed and the chief records it (``end_record``), so the
    evaluator knows which checkpoint is the last.

    Args:
        config: the ``checkpoint`` section (``dir`` must be set).
        hybrid: the ``HybridStrategy`` (or its ``StrategyState``) whose model
            this checkpoints; default: the hybridpar strategy in scope, if
            any. It decides who writes and what the manifest records.
        resume: restore the newest checkpoint when ``fit`` starts (default:
            ``config.backup_and_restore``).
        preemption: save and exit on SIGTERM.

    Raises:
        ConfigError: when ``dir`` is missing or not writable (on the chief).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        hybrid: Any = None,
        *,
        resume: bool | None = None,
        preemption: bool = True,
    ) -> None:
        super().__init__()
        if config.dir is None:
            raise ConfigError(
                "PeriodicCheckpoint needs checkpoint.dir. Received: None. Set checkpoint.dir."
            )
        self.state = _state_from(hybrid)
        self.config = config
        self.directory = storage.location(config.dir)
        self.writes = self.state is None or self.state.is_chief
        if self.writes:
            storage.ensure_writable(self.directory)
            publication.remove_partials(self.directory)
        self.every_steps = config.every_steps
        self.every_epochs = config.every_epochs
        self.keep = config.keep
        self.resume = config.backup_and_restore if resume is None else resume
        self.preemption = preemption
        self.asynchronous = self.state is not None and self.state.mode == "parameter_server"
        cluster = self.state.cluster if self.state is not None else None
        self.records_end = cluster is not None and "evaluator" in cluster.jobs
        if self.asynchronous and self.every_steps:
            logger.warning(
                "hybridpar: checkpoint.every_steps=%d is not applied in parameter-server mode "
                "(steps run asynchronously); checkpoints are written at epoch ends.",
                self.every_steps,
            )
        self.restored: files.Found | None = None
        self._own_watcher: Any = None
        self.saved: list[Any] = []
        self.writer = BackgroundWriter()
        self._reset_position()

    def _reset_position(self) -> None:
        self._epoch = self._batch = 0
        self._iterator: Any = None
        self._iterator_epoch = 0
        self._position = 0
        self._persists = False
        self._skip_calls = self._skip_extra = self._drawn_ahead = 0
        self._last_saved = -1
        self._original_train_function: Any = None
        self._pending_metrics: Any = None
        self._epoch_save_pending = False
        self._watcher: Any = None
        self._initial_batch = 0

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._reset_position()
        self.restored = None
        if self.records_end and self.writes:
            end_record.remove(self.directory)
        if not self.asynchronous:
            self._wrap_train_function()
        if self.resume:
            self._restore()
        # The restored step is on disk; with an evaluator, so must be the final one, even when
        # it is the step this fit started at.
        fresh = self.restored is None and self.records_end
        self._last_saved = -1 if fresh else self._step()
        if self.preemption:
            self._watcher = self._preemption_watcher()
            if self._watcher is not None:
                self._watcher.activate(lambda: self.save(reason="preemption", wait=True))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch, self._batch = epoch, 0
        if self._pending_metrics is not None:
            if self._skip_calls or self._skip_extra or self._initial_batch:
                model_state.assign_group(self.model, "metrics", self._pending_metrics)
            self._pending_metrics = None
        if self._initial_batch:
            self._batch, self._initial_batch = self._initial_batch, 0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.asynchronous and self._watcher is not None:
            self._watcher.step_done()  # before the step is scheduled: stop scheduling here

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch = batch + 1
        if self.asynchronous:
            return
        step = self._step()
        if self.every_steps and step % self.every_steps == 0 and step != self._last_saved:
            self.save()
        if self._watcher is not None:
            self._watcher.step_done()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch, self._batch = epoch + 1, 0
        if self.every_epochs and (epoch + 1) % self.every_epochs == 0 and self.asynchronous:
            # The snapshot lives on the ps tasks, which write it: a ps lost in the next epoch
            # must not take this epoch's checkpoint with it, so training waits for the write.
            self.save(wait=True)
        elif self.every_epochs and (epoch + 1) % self.every_epochs == 0:
            # Written before the next epoch's first step, once it is known whether that
            # epoch draws from a fresh iterator; the state is the same as now.
            self._epoch_save_pending = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._epoch_save_pending:
            self._epoch_save_pending = False
            self.save()
        self.writer.wait()
        if self.records_end:
            self._record_end()
        if self._original_train_function is not None:
            self.model.train_function = self._original_train_function
        if self.restored is not None:
            self.model._initial_epoch = None  # set by _restore, as Keras's BackupAndRestore does
            self.model._hybridpar_initial_batch = 0
        self._iterator = None
        if self._watcher is not None:
            self._watcher.deactivate()
            self._watcher = None

    def _record_end(self) -> None:
        """Checkpoints the final step (every worker takes part) and, once it is on disk,
        records the end."""
        self.save(reason="final", wait=True)
        if self.writes:
            end_record.write(self.directory, step=self._step(), epoch=self._epoch,
                             epochs=int(self.params.get("epochs") or self._epoch))
            logger.info("hybridpar: training ended at optimizer step %d; recorded %s for the "
                        "evaluator.", self._step(), END_FILE)

    def _preemption_watcher(self) -> Any:
        """The strategy's watcher (kept in its state), created on first use."""
        strategy = self.model.distribute_strategy
        holder = state_of(strategy)
        if holder is None:  # a strategy hybridpar did not build: this callback keeps it
            if self._own_watcher is None:
                self._own_watcher = preemption.create_watcher(strategy)
            return self._own_watcher
        if holder.preemption is None:
            holder.preemption = preemption.create_watcher(strategy)
        return holder.preemption

    # ------------------------------------------------------------------ data position

    def _wrap_train_function(self) -> None:
        """Counts the batches drawn from each iterator, and skips those already trained."""
        original = self._original_train_function = self.model.train_function
        per_call = int(getattr(self.model, "steps_per_execution", 1) or 1)

        def train_function(iterator):
            if iterator is not self._iterator:
                if self._iterator is not None:
                    self._persists = False
                self._iterator, self._iterator_epoch, self._position = iterator, self._epoch, 0
            elif self._iterator_epoch != self._epoch:
                self._persists = True
            if self._epoch_save_pending:
                self._epoch_save_pending = False
                self.save()
            ahead = self._skip_extra + self._skip_calls * per_call - self._drawn_ahead
            if ahead > 0:  # every batch to skip, at the first call, in one graph loop
                skipping.draw(iterator, ahead)
                self._position += ahead
                self._drawn_ahead += ahead
            self._skip_extra = 0
            if self._skip_calls:
                self._skip_calls -= 1
                return {}
            result = original(iterator)
            self._position += per_call
            return result

        self.model.train_function = train_function

    def _choose(self) -> files.Found | None:
        """The checkpoint to restore: the chief's choice on every worker (``coordination``)."""
        state = self.state
        cluster = state.cluster if state is not None else None
        coordinated = (not self.asynchronous and cluster is not None
                       and cluster.num_workers > 1)
        return coordination.choose(
            self.directory, coordinated=coordinated, is_chief=self.writes,
            task=str(cluster.task) if cluster is not None else "",
            deep=not self.asynchronous)  # the ps check their own reads (CRC32C)

    def _apply(self, found: files.Found) -> files.Found:
        """Restores ``found``; one that proves damaged as it is read (a ps's CRC32C check)
        falls back to the previous one when this task chose it alone."""
        while True:
            values = model_state.reader(found.path, found.manifest)
            try:
                if model_state.apply(self.model, found.path, found.manifest, values,
                                     metrics=False):
                    self._pending_metrics = values  # Keras resets metrics when the epoch begins
                return found
            except CheckpointDamagedError as err:
                if self.state is not None and self.state.cluster is not None and (
                        not self.asynchronous and self.state.cluster.num_workers > 1):
                    raise  # every worker must restore the same one
                logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous "
                               "one.", storage.name(found.path), err)
                previous = files.latest(self.directory, deep=not self.asynchronous,
                                        below=found.step)
                if previous is None:
                    raise
                found = files.Found(previous.path, previous.manifest,
                                    (*found.skipped, (found.path, str(err)), *previous.skipped))

    def _restore(self) -> None:
        found = self._choose()
        if found is None:
            logger.info("hybridpar: no checkpoint in %s yet; training from the start.",
                        self.directory)
            return
        model_state.ensure_built(self.model)
        found = self.restored = self._apply(found)
        if self.asynchronous:
            self._restore_asynchronous(found)
            return
        epoch, skip, extra = resume_plan(found.manifest, self.params.get("steps"))
        self.model._initial_epoch = epoch
        self._epoch = epoch
        self._skip_calls = skip // int(getattr(self.model, "steps_per_execution", 1) or 1)
        self._skip_extra = extra
        self._persists = bool(found.manifest["data"]["iterator_persists"])
        logger.info(
            "hybridpar: resumed from %s at optimizer step %d (epoch %d, skipping its first %d "
            "batch(es) already trained%s); %s",
            found.path, found.step, epoch + 1, skip, topology.SKIP_NOTE if skip + extra else "",
            self._topology_note(found.manifest),
        )

    def _restore_asynchronous(self, found: files.Found) -> None:
        """Parameter-server resume: inside the saved epoch, or at the next one."""
        epoch, batch, where = asynchronous_resume(found.manifest, self.params.get("steps"))
        self.model._initial_epoch = epoch
        self.model._hybridpar_initial_batch = batch  # read by the parameter-server fit loop
        self._epoch, self._initial_batch = epoch, batch
        logger.info("hybridpar: resumed from %s at optimizer step %d, %s; %s", found.path,
                    found.step, where, self._topology_note(found.manifest))

    def _topology_note(self, manifest: dict[str, Any]) -> str:
        return topology.resume_note(manifest, self._topology())

    # ------------------------------------------------------------------ saving

    def _topology(self) -> dict[str, Any]:
        return topology.current(self.state, self.model.distribute_strategy,
                                self.asynchronous)

    def save(self, reason: str = "periodic", wait: bool = False) -> Any:
        """Saves a checkpoint of the current step (on every worker; the chief writes).

        Args:
            reason: recorded in the manifest.
            wait: return only once the files are written (else they are
                written in the background; ``writer.wait()`` waits).

        Returns:
            The checkpoint directory on the chief, ``None`` on other workers.

        Raises:
            CheckpointWriteError: if this write (with ``wait``) or the
                previous background write failed.
        """
        step = self._step()
        if step == self._last_saved:
            return None
        data = {
            "epoch": self._epoch,
            "batch": self._batch,
            "iterator_position": self._position if self._epoch == self._iterator_epoch
            or self._persists else 0,
            "iterator_persists": self._persists,
        }
        if self.asynchronous:  # the workers' input has no position to record; the epoch's does
            data.update(iterator_position=self._batch, iterator_persists=False,
                        steps_per_epoch=self.params.get("steps"))
        extra = {
            "reason": reason,
            "config": self.state.config.to_dict() if self.state is not None else None,
            "topology": self._topology(),
        }
        if self.writes:
            self.writer.wait()  # one snapshot alive at a time
        pieces, manifest = model_state.snapshot(self.model, data, extra=extra,
                                                writes=self.writes)
        self._last_saved = step
        if not self.writes:
            return None
        directory, hasher = self.directory, model_state.hasher_for(self.model, self.directory)

        def write() -> None:
            model_state.write(directory, pieces, manifest, hasher)

        path = self.writer.submit(self.directory, step, write, self.keep)
        self.saved.append(path)
        if wait:
            self.writer.wait()
        return path

    def checkpoints(self) -> list[Any]:
        """Complete checkpoints in this directory, oldest first (after the write in flight)."""
        self.writer.wait()
        return files.list_checkpoints(self.directory)

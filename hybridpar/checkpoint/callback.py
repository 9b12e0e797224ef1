"""``PeriodicCheckpoint``: the Keras callback behind ``checkpoint.*`` (save, resume, preempt).

It decides when a checkpoint is saved, restored or recorded as the last;
how depends on the kind of training (``policy``), the choice and restore of
a checkpoint are ``resumption``'s, the background write ``writer``'s.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import tensorflow as tf

from hybridpar.checkpoint import (
    end_record,
    files,
    input_state,
    model_state,
    preemption,
    publication,
    resumption,
    skipping,
    storage,
    topology,
)
from hybridpar.checkpoint.manifest import END_FILE
from hybridpar.checkpoint.policy import SavePolicy, policy_for
from hybridpar.checkpoint.writer import BackgroundWriter
from hybridpar.config import CheckpointConfig
from hybridpar.errors import ConfigError
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
      part in a save; only the chief writes files (but for the ZeRO shards
      each worker holds, ``zero_shards``). A save blocks training
      only while the values are copied to host memory; the files are written
      in the background, one save at a time (``checkpoint.writer``), and the
      next save, the end of ``fit``, a preemption exit and process exit wait
      for the write in flight. A write that fails is logged and raised as
      ``CheckpointWriteError`` at the next save or the end of ``fit``.
    - With ``resume`` (``checkpoint.backup_and_restore``), ``fit`` first
      restores the newest undamaged checkpoint in ``dir`` and continues at
      its optimizer step: it starts at the saved epoch, at the first batch
      not yet trained. With ``save_iterator`` (the default) the input
      iterator's saved state is restored (``input_state``), so no batch is
      drawn again and a seeded ``shuffle`` continues in the uninterrupted
      run's orders. Where that state cannot serve (a Python generator,
      another topology) the trained batches are drawn again without training
      on them, which reproduces the uninterrupted run when each epoch's
      iterator yields the same batches whatever ran before in the process
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
        cluster = self.state.cluster if self.state is not None else None
        self.records_end = cluster is not None and "evaluator" in cluster.jobs
        # ``save`` is looked up at each call, as the hooks did: a save replaced on the
        # instance (benchmarks/checkpoint.py times it) is the one the policy calls too.
        self.policy: SavePolicy = policy_for(
            self.state, lambda **kwargs: self.save(**kwargs), lambda: self._epoch,
            skipping.draw, self.every_steps)
        self.restored: files.Found | None = None
        self._own_watcher: Any = None
        self.saved: list[Any] = []
        self.writer = BackgroundWriter()
        self.inputs = input_state.InputSaver()
        self._reset_position()

    @property
    def saves_input_iterator(self) -> bool:
        """Whether ``fit`` should read its training input through an iterator whose state
        this callback saves (``hybridpar.data.resumable``; read by hybridpar's trainer)."""
        return bool(self.config.save_iterator) and not self.policy.asynchronous

    def _worker(self) -> int:
        cluster = self.state.cluster if self.state is not None else None
        return cluster.worker_id if cluster is not None else 0

    def _reset_position(self) -> None:
        self._epoch = self._batch = 0
        self._last_saved = -1
        self._pending_metrics: Any = None
        self._resumes_inside = False
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
        self.policy.begin(self.model)
        model_state.announce_own_shards(self.model, self.writes)
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
            if self._resumes_inside:
                model_state.assign_groups(self.model, ["metrics"], self._pending_metrics)
            self._pending_metrics = None
        if self._initial_batch:
            self._batch, self._initial_batch = self._initial_batch, 0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.policy.step_begins(self._watcher)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch = batch + 1
        self.policy.step_ended(self._watcher, self._save_if_due)

    def _save_if_due(self) -> None:
        step = self._step()
        if self.every_steps and step % self.every_steps == 0 and step != self._last_saved:
            self.save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch, self._batch = epoch + 1, 0
        if self.every_epochs and (epoch + 1) % self.every_epochs == 0:
            self.policy.epoch_ended()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.policy.flush()
        self.writer.wait()
        if self.records_end:
            self._record_end()
        self.policy.end()
        if self.restored is not None:
            self.model._initial_epoch = None  # set by _restore, as Keras's BackupAndRestore does
            self.model._hybridpar_initial_batch = 0
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

    # ------------------------------------------------------------------ restoring

    def _restore(self) -> None:
        cluster = self.state.cluster if self.state is not None else None
        found = resumption.choose(self.directory, self.policy, is_chief=self.writes,
                                  task=str(cluster.task) if cluster is not None else "")
        if found is None:
            logger.info("hybridpar: no checkpoint in %s yet; training from the start.",
                        self.directory)
            return
        model_state.ensure_built(self.model)
        share = (self._worker(), cluster.num_workers) if self.policy.coordinated else None
        found, values, pending, saved_input = resumption.apply(
            self.model, self.directory, found, self.policy, share, self._worker())
        self._pending_metrics = values if pending else None
        self.restored = found
        trainer = self.state.trainer if self.state is not None else None
        restore_input = input_state.restorer(saved_input, found.manifest, self._worker(),
                                             self.params.get("steps"))
        resume = self.policy.resume(self.model, found.manifest, self.params.get("steps"),
                                    restore_input, getattr(trainer, "start_next_epoch_at", None))
        self.model._initial_epoch = resume.epoch
        self._epoch, self._initial_batch = resume.epoch, resume.batch
        self._resumes_inside = resume.inside
        logger.info("hybridpar: resumed from %s at optimizer step %d%s; %s", found.path,
                    found.step, resume.where,
                    topology.resume_note(found.manifest, self._topology()))

    # ------------------------------------------------------------------ saving

    def _topology(self) -> dict[str, Any]:
        return topology.current(self.state, self.model.distribute_strategy,
                                self.policy.asynchronous)

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
        data = self.policy.data(self._epoch, self._batch, self.params.get("steps"))
        inputs, record = self.inputs.capture(self.policy.live_iterator(self._epoch),
                                             self._worker())
        if record is not None:
            data = {**data, input_state.RECORD: record}
        extra = {
            "reason": reason,
            "config": self.state.config.to_dict() if self.state is not None else None,
            "topology": self._topology(),
        }
        if self.writes:
            model_state.check_own_shards(self.model)
            self.writer.wait()  # one snapshot alive at a time
        pieces, manifest = model_state.snapshot(self.model, data, extra=extra,
                                                writes=self.writes)
        pieces += inputs
        self._last_saved = step
        if not self.writes:
            model_state.write_own_shards(self.model, self.directory, step, pieces)
            return None
        directory = self.directory

        def write() -> None:
            model_state.write(directory, pieces, manifest)

        path = self.writer.submit(self.directory, step, write, self.keep)
        self.saved.append(path)
        if wait:
            self.writer.wait()
        return path

    def checkpoints(self) -> list[Any]:
        """Complete checkpoints in this directory, oldest first (after the write in flight)."""
        self.writer.wait()
        return files.list_checkpoints(self.directory)

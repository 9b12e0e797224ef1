"""Preemption: on SIGTERM training saves at a step boundary, then exits.

Synchronous training (one process, mirrored, multi-worker): every worker
saves at the same step boundary (``PreemptionWatcher``). Parameter-server
training: the chief, which alone runs the training loop, stops scheduling,
joins the steps in flight and saves (``CoordinatorPreemptionWatcher``).

Built on ``tf.distribute.experimental.PreemptionCheckpointHandler``: the
worker that gets SIGTERM announces, through the cluster's coordination
service, the step after its current one; every worker acknowledges, trains
up to that step, saves (all take part, the chief writes) and exits with
``PREEMPTED_EXIT_CODE``, which ``hybridpar launch --max-restarts`` restarts.
A single process (one device, mirrored) uses the same handler in local mode.

Upstream facts this module works with (TensorFlow 2.21):

- the handler insists on a ``tf.train.Checkpoint`` and restores it when
  created; hybridpar passes an empty one in a private temporary directory
  and saves its own checkpoint through ``TerminationConfig(save_fn=...)``;
- it installs its SIGTERM handler for the rest of the process and can be
  created once per cluster (its coordination keys are never cleared), so
  one handler is kept per strategy (in its ``StrategyState``) and its
  signal handler is installed only while ``model.fit`` runs; a SIGTERM that arrives when no training
  step follows is re-raised with the default action when ``fit`` ends;
- its peer watcher thread is stopped by its ``__del__``, so the handlers
  are released at exit while the cluster is still up;
- it does nothing on GCE CPU VMs (``detect_platform``) and refuses
  parameter-server clusters, which need no agreement between tasks: workers
  and ps tasks hold no training loop, and SIGTERM on one of them is what the
  coordinator's fault tolerance survives (a worker) or reports (a ps).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hybridpar.exit_codes import PREEMPTED_EXIT_CODE
from hybridpar.state import state_of

logger = logging.getLogger("hybridpar")


def _exit_preempted() -> None:
    """Exits with ``PREEMPTED_EXIT_CODE`` once the checkpoint is saved."""
    logger.warning("hybridpar: preempted; checkpoint saved, exiting with %d.",
                   PREEMPTED_EXIT_CODE)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(PREEMPTED_EXIT_CODE)


class _SigtermWatcher:
    """What both watchers share: SIGTERM is handled between ``activate`` and ``deactivate``."""

    def __init__(self) -> None:
        self._save: Callable[[], None] | None = None
        self._previous: Any = None
        self.signalled = False
        self.saved = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def activate(self, save: Callable[[], None]) -> None:
        """Handles SIGTERM from now on; ``save`` writes the checkpoint when it is time."""
        self._save = save
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def deactivate(self) -> None:
        """Restores the previous SIGTERM action; re-raises a SIGTERM that found no step."""
        self._save = None
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self.signalled and not self.saved:
            logger.warning("hybridpar: SIGTERM arrived after the last training step; "
                           "terminating as asked.")
            os.kill(os.getpid(), signal.SIGTERM)


class PreemptionWatcher(_SigtermWatcher):
    """One ``PreemptionCheckpointHandler`` per strategy, switched on while ``fit`` runs."""

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        super().__init__()
        resolver = getattr(strategy, "cluster_resolver", None)
        if resolver is not None and not resolver.cluster_spec().jobs:
            resolver = None
        private = tempfile.mkdtemp(prefix="hybridpar-preemption-")
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        previous = signal.getsignal(signal.SIGTERM)
        config = tf.distribute.experimental.TerminationConfig(
            exit_fn=_exit_preempted, save_fn=self._save_now
        )
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver, tf.train.Checkpoint(), checkpoint_dir=private, termination_config=config
        )
        self._tf_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if not self.signalled:
            logger.warning("hybridpar: received SIGTERM; saving a checkpoint at a step boundary "
                           "all workers agree on, then exiting with %d.", PREEMPTED_EXIT_CODE)
        self.signalled = True
        self._tf_sigterm(signum, frame)

    def _save_now(self) -> None:
        if self._save is not None:
            self._save()
        self.saved = True

    def step_done(self) -> None:
        """Call at every step boundary, on every worker: saves and exits if preempted."""
        self.handler.save_checkpoint_if_preempted()


class CoordinatorPreemptionWatcher(_SigtermWatcher):
    """SIGTERM on the parameter-server chief: stop scheduling, join, save, exit.

    Args:
        join: waits for every step scheduled so far (``ClusterCoordinator.join``).
    """

    def __init__(self, join: Callable[[], None]) -> None:
        super().__init__()
        self._join = join

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if not self.signalled:
            logger.warning("hybridpar: received SIGTERM; scheduling no more steps, joining those "
                           "in flight, then saving and exiting with %d.", PREEMPTED_EXIT_CODE)
        self.signalled = True

    def step_done(self) -> None:
        """Call before each step is scheduled: if signalled, joins, saves and exits."""
        if not self.signalled or self._save is None:
            return
        self._join()
        self._save()
        self.saved = True
        _exit_preempted()


_live: weakref.WeakSet[PreemptionWatcher] = weakref.WeakSet()
_said: set[str] = set()


@atexit.register
def _release_handlers() -> None:
    """Lets each handler shut down while the cluster is still up.

    A handler's ``__del__`` tells every worker's peer watcher thread to stop;
    held until interpreter teardown, it would run after this worker's
    coordination service is gone, and the other workers' watchers would die
    with "UnavailableError: Socket closed" tracebacks at the end of a good run.
    """
    for watcher in list(_live):
        watcher.handler = None
    gc.collect()


def _warn_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.warning(message)


def create_watcher(
    strategy: tf.distribute.Strategy,
) -> PreemptionWatcher | CoordinatorPreemptionWatcher | None:
    """A watcher for ``strategy``, or ``None`` (logged once) where one cannot work.

    Preemption handling needs the main thread (signal handlers); with
    parameter servers, a strategy hybridpar built (its coordinator joins the
    steps in flight). Create one per strategy and keep it
    (``StrategyState.preemption``): a cluster's handler can be created once.
    """
    if threading.current_thread() is not threading.main_thread():
        _warn_once("hybridpar: model.fit runs outside the main thread, so SIGTERM cannot "
                   "trigger a checkpoint; periodic checkpoints still work, and a restarted "
                   "run resumes from the last one.")
        return None
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        state = state_of(strategy)
        if state is not None and state.runner is not None:
            return CoordinatorPreemptionWatcher(state.runner.coordinator.join)
        _warn_once("hybridpar: preemption checkpoints need a parameter-server strategy built by "
                   "hybridpar.scope(); periodic checkpoints still work.")
        return None
    watcher = PreemptionWatcher(strategy)
    _live.add(watcher)
    return watcher

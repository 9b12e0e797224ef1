"""Keras callbacks hybridpar adds: checkpoints from config, and throughput.

``PeriodicCheckpoint`` (``hybridpar.checkpoint.callback``) saves, resumes at
the exact step and saves on preemption; ``Throughput`` adds examples per
second to each epoch's logs; ``defaults(config)`` is what
``hs.callbacks()`` returns.
"""

from __future__ import annotations

import time
from typing import Any

import keras

from hybridpar.checkpoint.callback import PeriodicCheckpoint
from hybridpar.checkpoint.storage import ensure_writable
from hybridpar.config import StrategyConfig

__all__ = ["PeriodicCheckpoint", "Throughput", "defaults", "ensure_writable"]


class Throughput(keras.callbacks.Callback):
    """Adds ``examples_per_sec`` to each epoch's logs (shown by the progress bar).

    The rate covers the training steps only, not validation at the epoch end.

    Args:
        global_batch_size: examples per step over all replicas.
    """

    def __init__(self, global_batch_size: int) -> None:
        super().__init__()
        self.global_batch_size = global_batch_size
        self.epoch_rates: list[float] = []
        self._start = self._last = 0.0
        self._steps = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = self._last = time.perf_counter()
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps += 1
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        elapsed = max(self._last - self._start, 1e-9)
        rate = self._steps * self.global_batch_size / elapsed
        self.epoch_rates.append(rate)
        if logs is not None:
            logs["examples_per_sec"] = rate


def defaults(config: StrategyConfig, hybrid: Any = None) -> list[keras.callbacks.Callback]:
    """The callbacks ``config.checkpoint`` asks for.

    With ``checkpoint.dir`` set: one ``PeriodicCheckpoint`` writing to
    ``dir`` (from the chief only), resuming from it when
    ``backup_and_restore`` is true, and saving on SIGTERM. Keras's own
    ``BackupAndRestore`` is not used: it restores the epoch only and writes
    from every worker.

    Args:
        config: the config.
        hybrid: the ``HybridStrategy`` the callbacks are for (default: the
            hybridpar strategy in scope, if any).

    Raises:
        ConfigError: if ``checkpoint.dir`` cannot be written (before training).
    """
    if config.checkpoint.dir is None:
        return []
    return [PeriodicCheckpoint(config.checkpoint, hybrid)]

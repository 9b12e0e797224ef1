"""Keras callbacks hybridpar adds: checkpoints from config, throughput."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import keras

from hybridpar.config import CheckpointConfig, StrategyConfig
from hybridpar.errors import ConfigError

logger = logging.getLogger("hybridpar")
_CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


def ensure_writable(directory: str | os.PathLike, key: str = "checkpoint.dir") -> Path:
    """Creates ``directory`` if needed and proves it can be written.

    Raises:
        ConfigError: naming the key, the directory and the OS error.
    """
    path = Path(directory)
    probe = path / f".hybridpar-write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"{key}={str(directory)!r} is not a writable directory "
            f"({err.strerror or err}). Choose a directory this process can create and "
            "write, before training starts."
        ) from None
    return path


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves the model's weights every N steps and/or epochs, keeping the last K.

    Each file is written under a temporary name and renamed into place, so a
    crash while writing never damages the previous checkpoint. Files are
    named ``ckpt-<optimizer step>.weights.h5``.
    """

    def __init__(self, config: CheckpointConfig) -> None:
        super().__init__()
        if config.dir is None:
            raise ConfigError("PeriodicCheckpoint needs checkpoint.dir. Received: None.")
        self.directory = ensure_writable(config.dir)
        self.every_steps = config.every_steps
        self.every_epochs = config.every_epochs
        self.keep = config.keep

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every_steps and self._step() % self.every_steps == 0:
            self.save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every_epochs and (epoch + 1) % self.every_epochs == 0:
            self.save()

    def save(self) -> Path:
        """Writes a checkpoint for the current optimizer step and prunes old ones."""
        step = self._step()
        final = self.directory / f"ckpt-{step:08d}.weights.h5"
        partial = self.directory / f".partial-{os.getpid()}-{step:08d}.weights.h5"
        try:
            self.model.save_weights(partial)
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
        for stale in self.checkpoints()[: -self.keep]:
            stale.unlink()
        return final

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints in this directory, oldest first."""
        found = [p for p in self.directory.iterdir() if _CHECKPOINT_RE.match(p.name)]
        return sorted(found, key=lambda p: int(_CHECKPOINT_RE.match(p.name)[1]))


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

    With ``checkpoint.dir`` set: periodic weight checkpoints under
    ``<dir>/weights`` and, if ``backup_and_restore``, Keras's
    ``BackupAndRestore`` under ``<dir>/backup`` so a relaunched run resumes.
    Under a multi-worker ``hybrid`` strategy only the chief writes to ``dir``
    (the others to private temporary dirs), and backup/restore is left out:
    Keras's restores each worker from its own dir, which would let workers
    diverge after a restart.

    Args:
        config: the config.
        hybrid: the active ``HybridStrategy`` (default: ``hybridpar.current()``).

    Raises:
        ConfigError: if ``checkpoint.dir`` cannot be written (before training).
    """
    from hybridpar.strategy import current

    hybrid = hybrid if hybrid is not None else current()
    checkpoint = config.checkpoint
    if checkpoint.dir is None:
        return []
    directory = hybrid.output_dir(checkpoint.dir) if hybrid is not None else checkpoint.dir
    root = ensure_writable(directory)
    weights = CheckpointConfig(
        dir=str(root / "weights"),
        every_steps=checkpoint.every_steps,
        every_epochs=checkpoint.every_epochs,
        keep=checkpoint.keep,
    )
    result: list[keras.callbacks.Callback] = [PeriodicCheckpoint(weights)]
    multi_worker = hybrid is not None and hybrid.mode == "multi_worker"
    if checkpoint.backup_and_restore and multi_worker:
        logger.warning(
            "hybridpar: checkpoint.backup_and_restore is not applied under multi_worker yet "
            "(Keras restores each worker from its own directory); periodic checkpoints are."
        )
    elif checkpoint.backup_and_restore:
        result.append(
            keras.callbacks.BackupAndRestore(
                backup_dir=str(root / "backup"),
                save_freq=checkpoint.every_steps or "epoch",
            )
        )
    return result

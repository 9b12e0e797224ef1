"""Training checkpoints that survive crashes, preemption and topology changes.

A checkpoint is a directory ``<dir>/ckpt-<optimizer step, 8 digits>/``
holding ``state.npz`` (every model, optimizer and metric variable) and
``manifest.json`` (step, epoch, batch, data position, config, topology,
variable specs, size and SHA-256). ``files`` is the format (numpy only),
``model_state`` captures and restores models, ``callback`` is
``PeriodicCheckpoint``, ``preemption`` saves on SIGTERM.

Public functions: ``latest(dir)``, ``list_checkpoints(dir)``, ``verify(path)``,
``restore(model, dir_or_checkpoint)``, ``save(model, dir, ...)``.
"""

from hybridpar.checkpoint.files import Found, latest, list_checkpoints, verify
from hybridpar.checkpoint.model_state import restore, save, save_position

__all__ = ["Found", "latest", "list_checkpoints", "restore", "save", "save_position", "verify"]

"""Training checkpoints that survive crashes, preemption and topology changes.

A checkpoint is a directory ``<dir>/ckpt-<optimizer step, 8 digits>/``
holding every model, optimizer and metric variable in TensorFlow's
tensor-bundle format (``state.index``, one ``state.data-*`` file per task
that holds variables) and ``manifest.json`` (step, epoch, batch, data
position, config, topology, variable specs, each file's size and checksum:
the index's SHA-256, TensorFlow's per-tensor CRC32C for the data files).
``manifest`` holds the format's pure rules, ``storage`` the file access
(any ``tf.io.gfile`` filesystem), ``files`` the directories (naming,
listing, checks, keep-N, damage fallback), ``publication`` their atomic
publication and deletion, ``npz`` the earlier format, ``end_record`` the
record of ``fit``'s end, ``layout`` and ``tensor_io`` the variables and
their reads and writes per task,
``flat_slices`` a ZeRO shard's element range as stored boxes, ``zero_shards``
each worker's own write of its ZeRO shards,
``model_state`` captures and restores models, ``coordination`` has every
worker restore the chief's choice, ``read_shares`` and ``shared_restore``
have each worker read its share of it, ``input_state`` saves each worker's
input iterator, ``callback`` is ``PeriodicCheckpoint``,
``preemption`` saves on SIGTERM, ``export`` writes Keras weights files.

Public functions: ``latest(dir)``, ``list_checkpoints(dir)``, ``verify(path)``,
``restore(model, dir_or_checkpoint)``, ``save(model, dir, ...)``,
``export_weights(checkpoint, model, "model.weights.h5")``. Those that need
TensorFlow are imported on first use, so the format's pure modules stay light.
"""

import importlib
from typing import Any

from hybridpar.checkpoint.files import Found, latest, list_checkpoints, verify

__all__ = ["Found", "export_weights", "latest", "list_checkpoints", "restore", "save",
           "save_position", "verify"]

_LAZY = {"restore": "model_state", "save": "model_state", "save_position": "model_state",
         "export_weights": "export"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"hybridpar.checkpoint.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'hybridpar.checkpoint' has no attribute {name!r}")

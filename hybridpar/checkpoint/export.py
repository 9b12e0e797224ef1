"""A hybridpar checkpoint as a plain Keras weights file (``model.weights.h5``).

``export_weights(checkpoint, model, target)`` restores the checkpoint's
weights into ``model`` (built as it was trained, in any scope or none) and
writes them with ``model.save_weights``, so a Keras user without hybridpar
reads them with ``model.load_weights``. The command
``hybridpar checkpoint export CKPT --to model.weights.h5`` rebuilds the
model from the architecture the chief recorded in the manifest
(``model_config``: ``model.to_json()``, when the model can be serialized;
custom layers must be importable, ``--import MODULE``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import keras

from hybridpar.checkpoint import files, model_state, storage
from hybridpar.errors import ConfigError

logger = logging.getLogger("hybridpar")

def _checkpoint(source: str | os.PathLike) -> files.Found:
    if files.step_of(source) is not None:
        return files.Found(storage.location(source), files.verify(source))
    found = files.latest(source)
    if found is None:
        raise FileNotFoundError(f"No checkpoint in {source} (expected directories named "
                                "ckpt-<step>, or one of them).")
    return found


def export_weights(checkpoint: str | os.PathLike, model: Any = None,
                   target: str | os.PathLike = "model.weights.h5") -> Any:
    """Writes a checkpoint's weights as a Keras ``.weights.h5`` file.

    Args:
        checkpoint: a checkpoint directory, or a directory of them (the newest is used).
        model: the model it was trained as, built; default: rebuilt from
            the manifest's ``model_config``.
        target: the file to write (its name must end in ``.weights.h5``).

    Returns:
        The model holding the exported weights.

    Raises:
        ConfigError: without ``model`` when the checkpoint recorded no
            architecture, or for a target Keras would refuse.
        CheckpointMismatchError: when ``model`` is not the one that wrote it.
    """
    if not os.fspath(target).endswith(".weights.h5"):
        raise ConfigError(f"The exported weights file must end in .weights.h5 (Keras's "
                          f"format). Received: --to {os.fspath(target)!r}.")
    found = _checkpoint(checkpoint)
    if model is None:
        text = found.manifest.get("model_config")
        if text is None:
            raise ConfigError(
                f"Checkpoint {found.path} records no model architecture (the model could not "
                "be serialized with to_json, e.g. a subclassed model without get_config). "
                "Export it from Python: hybridpar.checkpoint.export_weights(checkpoint, "
                "model, target) with the model built.")
        model = keras.models.model_from_json(text)
    values = model_state.reader(found.path, found.manifest)
    model_state.apply(model, found.path, found.manifest, values, optimizer=False, metrics=False)
    if getattr(model, "optimizer", None) is not None:  # Keras writes its state too: the saved one
        model_state.ensure_built(model)
        if model_state.matches(model, found.manifest, "optimizer"):
            model_state.assign_groups(model, ["optimizer"], values)
        else:
            logger.warning("hybridpar: the optimizer of %s differs from the model's; the "
                           "exported file holds the model's own optimizer state.", found.path)
    model.save_weights(os.fspath(target))
    logger.info("hybridpar: exported the weights of %s (step %d) to %s", found.path,
                found.step, os.fspath(target))
    return model


def main(argv: Sequence[str]) -> int:
    """``hybridpar checkpoint export CKPT --to model.weights.h5 [--import MODULE ...]``."""
    parser = argparse.ArgumentParser(prog="hybridpar checkpoint")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write a checkpoint's weights for Keras")
    export.add_argument("checkpoint", help="ckpt-<step> directory, or a directory of them")
    export.add_argument("--to", required=True, help="target file, ending in .weights.h5")
    export.add_argument("--import", dest="imports", action="append", default=[],
                        help="module defining the model's custom layers (repeatable)")
    args = parser.parse_args(list(argv))
    for module in args.imports:
        importlib.import_module(module)
    try:
        model = export_weights(args.checkpoint, target=args.to)
    except (ConfigError, FileNotFoundError) as err:
        parser.exit(2, f"hybridpar checkpoint: {err}\n")
    print(json.dumps({"exported": os.fspath(args.to), "model": model.name,
                      "weights": len(model.weights)}))
    return 0

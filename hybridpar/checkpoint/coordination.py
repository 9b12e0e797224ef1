"""Coordinated restore: the chief chooses the checkpoint, every worker restores that one.

Under a multi-worker strategy each worker restores its own copy of the
variables, so each must read the same checkpoint. The chief picks the newest
undamaged one (``files.latest``) and publishes its choice in the cluster's
coordination service (the key-value store ``cluster_join`` already uses);
the other workers wait for it, check that their own ``checkpoint.dir`` holds
that very checkpoint (its name, and the SHA-256 of its index in the
manifest) and restore it. A worker that cannot see the chosen checkpoint
fails at once, naming the path: ``checkpoint.dir`` must be one directory
every worker shares. Without a
cluster (or in parameter-server mode, where only the chief restores) the
choice is this process's own.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tensorflow.python.eager import context

from hybridpar.checkpoint import files, storage
from hybridpar.checkpoint.files import Found
from hybridpar.errors import CheckpointDamagedError, ConfigError

logger = logging.getLogger("hybridpar")

_KEY = "hybridpar/checkpoint/restore/"
WAIT_SECONDS = 600
_rounds = 0  # restores this process took part in; every worker counts the same


def _round_key() -> str:
    global _rounds
    _rounds += 1
    return f"{_KEY}{_rounds}"


def _choice(found: Found | None) -> str:
    if found is None:
        return json.dumps({"name": None})
    fingerprint = _fingerprint(found.manifest)
    return json.dumps({"name": storage.name(found.path), "step": found.step,
                       "where": os.fspath(found.path), "files": fingerprint,
                       "skipped": [[storage.name(p), why] for p, why in found.skipped]})


def _fingerprint(manifest: dict[str, Any]) -> dict[str, Any]:
    """Each file's SHA-256 (the index's covers every tensor's CRC32C), else its size."""
    return {name: entry.get("sha256", entry["bytes"]) for name, entry in manifest["files"].items()}


def choose(directory: str | os.PathLike, *, coordinated: bool, is_chief: bool,
           task: str = "", deep: bool = True) -> Found | None:
    """The checkpoint to restore, the same on every worker when ``coordinated``.

    Raises:
        CheckpointDamagedError: when every checkpoint is damaged (on every worker).
        ConfigError: on a worker that cannot see the chief's choice.
    """
    if not coordinated:
        return files.latest(directory, deep=deep)
    ctx, key = context.context(), _round_key()
    if is_chief:
        try:
            found = files.latest(directory, deep=deep)
        except CheckpointDamagedError as err:
            ctx.set_config_key_value(key, json.dumps({"error": str(err)}))
            raise
        ctx.set_config_key_value(key, _choice(found))
        return found
    choice = json.loads(ctx.get_config_key_value(key, timeout_in_ms=WAIT_SECONDS * 1000))
    if "error" in choice:
        raise CheckpointDamagedError(f"the chief found no usable checkpoint: {choice['error']}")
    if choice["name"] is None:
        return None
    return _follow(choice, directory, task)


def _follow(choice: dict[str, Any], directory: str | os.PathLike, task: str) -> Found:
    """The chief's choice, found in this worker's own ``checkpoint.dir``."""
    for name, why in choice["skipped"]:
        logger.warning("hybridpar: checkpoint %s is damaged: %s; trying the previous one "
                       "(the chief's choice).", name, why)
    path = storage.join(directory, choice["name"])
    try:
        manifest = files.verify(path, deep=False)
    except CheckpointDamagedError as err:
        manifest, problem = None, str(err)
    else:
        same = _fingerprint(manifest) == choice["files"]
        problem = None if same else "it holds another checkpoint there"
    if manifest is None or problem:
        raise ConfigError(
            f"The chief chose checkpoint {choice['where']} (step {choice['step']}) to restore, "
            f"but {task or 'this worker'} cannot see it at {os.fspath(path)} ({problem}). "
            "checkpoint.dir must be a directory that every worker shares (the same path on "
            "shared storage, or a gs:// or s3:// URL), not a local directory of each machine."
        )
    return Found(path, manifest, tuple((storage.join(directory, name), why)
                                       for name, why in choice["skipped"]))

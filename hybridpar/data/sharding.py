"""Input sharding over the workers of a cluster: ``data.shard_policy``.

``describe_sharding`` is the pure decision (FILE when the input reads at
least as many files as there are workers, else DATA); ``shard_dataset``
applies it as the dataset's auto-shard option and says which once.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from hybridpar.data.inspect import input_files

logger = logging.getLogger("hybridpar")

_said: set[str] = set()


def describe_sharding(policy: str, files: int | None, workers: int) -> tuple[str, str]:
    """Resolves ``data.shard_policy`` for an input (pure logic).

    Returns:
        The chosen policy (``file``, ``data`` or ``off``) and why.
    """
    if policy != "auto":
        return policy, f"data.shard_policy={policy}"
    if files is not None and files >= workers:
        return "file", f"file-based input with {files} files >= {workers} workers"
    if files is None:
        return "data", "the input is not read from files"
    return "data", f"only {files} input file(s) for {workers} workers"


def chosen_policy(dataset: tf.data.Dataset, num_workers: int, policy: str) -> str:
    """``data.shard_policy`` resolved for ``dataset`` (``file``, ``data`` or ``off``),
    said once per distinct choice."""
    chosen, why = describe_sharding(policy, input_files(dataset), num_workers)
    message = f"hybridpar: sharding the input by {chosen.upper()} over {num_workers} workers"
    message += f" ({why})."
    if message not in _said:
        _said.add(message)
        logger.info(message)
    return chosen


def shard_dataset(dataset: Any, num_workers: int, policy: str) -> Any:
    """Sets the auto-shard policy of a dataset and says which it chose (once)."""
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    return with_policy(dataset, chosen_policy(dataset, num_workers, policy))


def with_policy(dataset: tf.data.Dataset, chosen: str) -> tf.data.Dataset:
    """``dataset`` with the auto-shard option of a resolved policy."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "file": tf.data.experimental.AutoShardPolicy.FILE,
        "data": tf.data.experimental.AutoShardPolicy.DATA,
        "off": tf.data.experimental.AutoShardPolicy.OFF,
    }[chosen]
    return dataset.with_options(options)

"""Where Keras counts an epoch's steps: single examples are batched, per-worker files counted.

Upstream (Keras 3.15, ``TFEpochIterator``): Keras counts the steps of an
epoch from the dataset it is given, before the strategy sees it. So:

- a dataset of single examples has to be batched where ``fit``/``evaluate``/
  ``predict`` (and validation data) enter, for the progress bar to count the
  real steps: the trainer of a strategy hybridpar built (``hybridpar.training``,
  through ``trainer_hooks``) batches it there by ``data.global_batch_size``;
  batched datasets pass unchanged;
- under ``multi_worker`` with ``file`` or ``off`` sharding each worker steps
  through the pieces of its own batches, which is not the dataset's number of
  batches (2 workers, 2 files of 148 and 149 examples in batches of 64: 5
  batches, but each worker takes 6 steps of 32, 32, 32, 32, 10 and 10 or 11):
  Keras would stop at 5 and leave 20 examples out of ``evaluate`` and
  ``predict``. For evaluation and prediction (``evaluate``, ``predict``,
  validation data) hybridpar hands Keras the dataset with its count unknown
  there (a ``filter`` that keeps every element), so they end when every
  worker's data has ended (the strategy agrees on it). ``fit``'s training
  data keeps Keras's count: an epoch of unknown length runs until the data
  has ended (the step that meets the end changes nothing, ``end_of_data_step``),
  and ``fit`` on such files is given ``steps_per_epoch`` when the workers' files
  differ.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hybridpar.compat.patching import Fix, register
from hybridpar.data import inspect, sharding
from hybridpar.errors import ConfigError
from hybridpar.state import StrategyState


def epoch_arguments(state: StrategyState, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of Keras's ``TFEpochIterator`` with hybridpar's input fixes.

    A dataset of single examples is batched by ``data.global_batch_size``; for
    evaluation and prediction under per-worker files its count is made unknown
    (see the module doc).

    Raises:
        ConfigError: for single examples without ``data.global_batch_size``.
    """
    x = kwargs.get("x")
    if isinstance(x, tf.data.Dataset) and not inspect.is_batched(x):
        if state.global_batch_size is None:
            raise ConfigError(
                "The dataset given to Keras yields single examples and "
                "data.global_batch_size is null, so hybridpar cannot batch it. Set "
                "data.global_batch_size, or batch the dataset yourself."
            )
        kwargs = {**kwargs, "x": x.batch(state.global_batch_size)}
        x = kwargs["x"]
    evaluating = "class_weight" not in kwargs  # fit's training data passes one
    if (evaluating and kwargs.get("steps_per_epoch") is None
            and _steps_are_per_worker(state, x)):
        kwargs = {**kwargs, "x": x.filter(_every_element)}  # a dataset of unknown cardinality
    return kwargs


def _every_element(*_: Any) -> tf.Tensor:
    return tf.constant(True)


def _steps_are_per_worker(state: StrategyState, dataset: Any) -> bool:
    """True when each worker of a multi-worker strategy steps through its own files."""
    cluster = state.cluster
    if state.mode != "multi_worker" or cluster is None or cluster.num_workers < 2:
        return False
    if not isinstance(dataset, tf.data.Dataset):
        return False
    policy = sharding.chosen_policy(dataset, cluster.num_workers, state.config.data.shard_policy)
    return policy != "data"


FIX = register(Fix(
    name="unbatched_input",
    corrects="Keras counts steps before the strategy sees the dataset, so unbatched input "
             "shows wrong progress",
    group="core",
    part_of="trainer_hooks",
))

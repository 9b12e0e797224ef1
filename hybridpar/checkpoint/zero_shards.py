"""State only one worker holds, over several workers: each worker writes its replicas' slices.

Sharded over workers (``data_parallel.shard_optimizer_state`` in
``multi_worker`` mode), a worker holds the optimizer slots of its own
replicas' shards only, and no other task can read them; with PowerSGD
(``communication.compression``) it holds its replicas' error memory, and with
a resumable input (``input_state``) its own iterator's state. At every save
each non-chief worker writes those itself, as one tensor bundle of its own
(``SaveV2`` on its CPU) under ``checkpoint.dir/.zero-ckpt-<step>-worker-<k>``,
and publishes where in the cluster's coordination service (the key-value
store the coordinated restore uses). The chief's write waits for every
worker's bundle and merges it with its own (``MergeV2Checkpoints`` moves
the data files into the checkpoint), as it merges each parameter server's.
``checkpoint.dir`` must be shared by every worker, as it must for restoring.
A bundle the chief never merged (it died during the save) is removed with
the partial writes when the next run's chief starts
(``publication.remove_partials``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_io_ops

from hybridpar.checkpoint import storage, tensor_io
from hybridpar.checkpoint.manifest import ZERO_STAGING_PREFIX, checkpoint_name
from hybridpar.errors import CheckpointWriteError
from hybridpar.state import state_of

_KEY = "hybridpar/checkpoint/zero/"
WAIT_SECONDS = 600
ANNOUNCED_SECONDS = 10  # coordination-service latency only: see check_savers


def sharded_over_workers(model: Any) -> Any:
    """The model optimizer's ZeRO state when its shards are spread over workers, else ``None``."""
    state = state_of(getattr(model, "_distribute_strategy", None))
    sharding = getattr(state, "zero", None)
    found = sharding.state_for(model.optimizer) if sharding is not None else None
    return found if found is not None and found.workers > 1 else None


def _key(step: int, worker: int) -> str:
    return f"{_KEY}{checkpoint_name(step)}/worker-{worker}"


def write_own(directory: str | os.PathLike, step: int, worker: int,
              pieces: Sequence[tensor_io.Piece]) -> None:
    """On a non-chief worker: writes its slices and tells the chief where (see the module
    doc), or that it holds nothing this time (its input could not be saved)."""
    prefix = None
    if pieces:
        staging = storage.join(directory,
                               f"{ZERO_STAGING_PREFIX}{checkpoint_name(step)}-worker-{worker}")
        storage.rmtree(staging)
        storage.makedirs(staging)
        prefix = os.fspath(storage.join(staging, "part"))
        with tf.device(f"{tensor_io.local_host()}/device:CPU:0"):
            gen_io_ops.save_v2(prefix, [p.key for p in pieces], [p.spec for p in pieces],
                               [p.value for p in pieces])
    context.context().set_config_key_value(
        _key(step, worker), json.dumps({"task": tensor_io.task_name(tensor_io.local_host()),
                                        "prefix": prefix}))


def announce_saver(worker: int) -> None:
    """On a non-chief worker whose checkpoint callback starts training: it will write its
    shards at every save (``check_savers`` reads it)."""
    # an earlier fit in this process may have announced it
    with contextlib.suppress(tf.errors.AlreadyExistsError):
        context.context().set_config_key_value(f"{_KEY}savers/worker-{worker}", "1")


def check_savers(workers: int) -> None:
    """On the chief before its first save: every worker runs a checkpoint callback.

    Every worker has taken a step by then (each step is collective), so its
    callback's ``on_train_begin`` has announced it, if it has one: a missing
    announcement means a worker that will never write its shards.

    Raises:
        CheckpointWriteError: naming the worker and what to pass to its ``fit``.
    """
    ctx = context.context()
    for worker in range(1, workers):
        try:
            ctx.get_config_key_value(f"{_KEY}savers/worker-{worker}",
                                     timeout_in_ms=ANNOUNCED_SECONDS * 1000)
        except Exception as err:  # the coordination service's DeadlineExceeded
            raise CheckpointWriteError(
                f"worker {worker} trains without hybridpar's checkpoint callback, so it will "
                "never write the state only it holds (its ZeRO optimizer shards with "
                "data_parallel.shard_optimizer_state, its replicas' PowerSGD error memory, "
                "its input iterator's position: each worker writes its own at every save), "
                "and no checkpoint can be complete. "
                "Pass the same callbacks on every task: model.fit(..., "
                "callbacks=hs.callbacks()) in the one script all workers run. (No "
                f"announcement from worker {worker} within {ANNOUNCED_SECONDS} s: {err})"
            ) from err


def collect(step: int, workers: int) -> list[tuple[str, str]]:
    """On the chief: ``(task, bundle prefix)`` of what workers ``1..workers-1`` wrote for
    ``step``.

    Raises:
        CheckpointWriteError: when a worker's bundle does not come within ``WAIT_SECONDS``,
            or this task cannot see it (``checkpoint.dir`` not shared).
    """
    ctx, prefixes = context.context(), []
    for worker in range(1, workers):
        try:
            told = json.loads(ctx.get_config_key_value(_key(step, worker),
                                                       timeout_in_ms=WAIT_SECONDS * 1000))
        except Exception as err:  # the coordination service's DeadlineExceeded, or it is gone
            raise CheckpointWriteError(
                f"worker {worker} did not write its own state for "
                f"{checkpoint_name(step)} within {WAIT_SECONDS} s ({err}).") from err
        ctx.delete_config_key_value(_key(step, worker))
        if told["prefix"] is None:
            continue
        if not storage.exists(f"{told['prefix']}.index"):
            raise CheckpointWriteError(
                f"{told['task']} wrote its own state for {checkpoint_name(step)} to "
                f"{told['prefix']}, which this task cannot see. Each worker writes the state "
                "only it holds (ZeRO optimizer shards, PowerSGD error memory, its input's "
                "position): "
                "checkpoint.dir must be a directory every worker shares.")
        prefixes.append((told["task"], told["prefix"]))
    return prefixes

"""ZeRO stage 1 in hybridpar's mirrored and multi-worker strategies.

With ``data_parallel.shard_optimizer_state: true`` an optimizer trained
under such a strategy creates no slots of its own. Each local replica gets
instead, on its own device, one flat ``ShardValue`` per bucket (``zero_plan``;
it holds no storage, ``hybridpar.parallel.shard_value``) and a replica
optimizer: a copy of the user's optimizer (``from_config``) built on those
shards, so its slots exist for the replica's shard only. A train step, in each
replica:

1. flattens the replica's gradients into the buckets and reduce-scatters them:
   an all-to-all of the ``N`` padded chunks followed by a local sum (TF 2.21
   has no CPU kernel for ``CollectiveReduceScatterV2``, "did not find
   collective implementation"; ``CollectiveAllToAllV2`` moves the same
   ``(N - 1) / N`` of the bucket per replica). With ``communication.compression``
   fp16/bf16 each replica's chunks are divided by ``N`` and sent in that dtype
   (``hybridpar.parallel.compression.to_wire``), then summed in their own;
2. binds its shard of the (replicated) weights to the ``ShardValue`` and
   runs the replica optimizer's ``update_step`` on it with the reduced
   gradient shard and the outer optimizer's learning rate and step count;
3. all-gathers the updated shards and writes them into its copy of each weight
   (in the weights' dtype: rounding them on the wire would leave each owner's
   copy apart from the others').

With model-parallel stages each stage's variables form buckets of their own
(``zero_plan``), sharded over the replicas of that stage: a replica's shard
and slots of a bucket sit on the device holding the bucket's variables, and
its update runs there; the collectives run on the launchers' (stage-0)
devices, as the unsharded stage all-reduce does.

Reduce-scatter plus all-gather is the bytes of one all-reduce. The replica
id is a Python int when a ``tf.distribute`` replica function is traced
(once per replica and device), so each replica's trace names its own shard.
Clipping and weight decay keep Keras's own path: both run on the whole
variables before the update step, exactly as without sharding.

Checkpoints store the shards as the slots an unsharded optimizer has: the
hook that stops Keras creating slots records which it asked for
(``note_slot``), and ``checkpoint_slots`` lists them in Keras's order, each
with the ranges of it the local replicas' shards hold
(``hybridpar.checkpoint.layout``).

Per-replica optimizers, rather than one optimizer over every shard, because
Keras optimizers keep per-optimizer counters and the update of a replica
must read and write only variables on that replica's device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops
from tensorflow.python.ops import collective_ops, resource_variable_ops

from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError
from hybridpar.parallel import zero_plan
from hybridpar.parallel.all_reduce import all_reduce_sum
from hybridpar.parallel.compression import FLOATING, LOW_DTYPES, from_wire, to_wire
from hybridpar.parallel.shard_value import ShardValue
from hybridpar.topology.plan import Plan

logger = logging.getLogger("hybridpar")

_VARIABLE_ARGUMENTS = ("initial_value", "trainable", "name", "dtype", "shape", "aggregation",
                       "synchronization", "validate_shape", "constraint")


def from_config(config: StrategyConfig, strategy_plan: Plan) -> ZeroSharding | None:
    """The sharding of a strategy about to be built, or ``None`` when it has none.

    With one replica nothing is sharded: a warning says so and training runs unsharded.

    Raises:
        ConfigError: in parameter-server mode, or with PowerSGD compression (its low-rank
            factors are of whole matrices, which no replica holds the gradient of).
    """
    if not config.data_parallel.shard_optimizer_state:
        return None
    head = "data_parallel.shard_optimizer_state=true"
    if strategy_plan.mode == "parameter_server":
        raise ConfigError(
            f"{head} shards optimizer state over the replicas of modes 'mirrored' and "
            "'multi_worker'; in parameter-server mode the ps tasks already hold each "
            "variable's optimizer state once. Received: data_parallel.mode='parameter_server'"
            f"{' (resolved from TF_CONFIG)' if config.data_parallel.mode == 'auto' else ''}. "
            "Set data_parallel.shard_optimizer_state to false, or train in mode 'multi_worker'."
        )
    if strategy_plan.num_replicas == 1:
        logger.warning("hybridpar: %s has no effect with 1 replica (nothing to shard over); "
                       "training unsharded.", head)
        return None
    compression = config.communication.compression
    if compression == "powersgd":
        raise ConfigError(
            f"{head} reduce-scatters flat shards of the gradients, and PowerSGD compresses "
            "whole gradient matrices into low-rank factors, so the two do not compose. "
            "Received: communication.compression='powersgd'. Use compression 'fp16' or "
            "'bf16' (the reduce-scatter is sent in that dtype), or set "
            "shard_optimizer_state to false."
        )
    return ZeroSharding(strategy_plan.mode, LOW_DTYPES.get(compression))


class ZeroSharding:
    """``shard_optimizer_state`` of one strategy: the sharded state of each optimizer."""

    def __init__(self, mode: str, wire: tf.DType | None = None) -> None:
        self.mode = mode
        self.wire = wire
        self._states: weakref.WeakKeyDictionary[Any, ShardedState] = weakref.WeakKeyDictionary()

    def note_slot(self, optimizer: Any, reference: Any, name: str) -> None:
        """Records a slot Keras's ``build`` asked ``optimizer`` for (it makes none), in order:
        checkpoints store the sharded slots as the slots an unsharded optimizer makes.
        ``BaseOptimizer.build`` built the sharded state before ``Adam.build`` asks."""
        self._states[optimizer].note_slot(optimizer, reference, name)

    def check(self, optimizer: Any) -> None:
        """Raises ConfigError when ``optimizer`` cannot be sharded (``zero_plan``)."""
        zero_plan.check_shardable(type(optimizer).__name__, optimizer.get_config(), self.mode)

    def build(self, strategy: tf.distribute.Strategy, optimizer: Any,
              variables: Sequence[Any]) -> ShardedState:
        """Creates ``optimizer``'s shards and replica optimizers, in cross-replica context."""
        if optimizer not in self._states:
            self.check(optimizer)
            with tf.init_scope():
                self._states[optimizer] = ShardedState(strategy, optimizer, variables,
                                                       self.wire)
            wire = "" if self.wire is None else f"; gradients reduce-scattered as {self.wire.name}"
            logger.info("hybridpar: %s%s", self._states[optimizer].plan.summary(), wire)
        return self._states[optimizer]

    def state_for(self, optimizer: Any) -> ShardedState | None:
        """The sharded state of ``optimizer``, once built."""
        return self._states.get(optimizer)


def _plain_variables() -> Any:
    """A variable creator that makes plain variables on the current device, bypassing the
    strategy's (which would mirror them)."""
    def creator(next_creator: Any, **kwargs: Any) -> tf.Variable:
        arguments = {k: v for k, v in kwargs.items() if k in _VARIABLE_ARGUMENTS}
        return resource_variable_ops.ResourceVariable(**arguments)

    return tf.variable_creator_scope(creator)


class _ReplicaLocal:
    """The strategy a replica optimizer sees: its variables are plain, so colocating with
    one is placing on its device (set as the optimizer's ``_distribution_strategy``)."""

    class extended:  # the attribute Keras reads
        @staticmethod
        def colocate_vars_with(variable: Any) -> contextlib.AbstractContextManager:
            return tf.device(variable.device)


def bucket_device(bucket: zero_plan.Bucket, local: int) -> str:
    """The device on which local replica ``local`` holds ``bucket``'s variables (with
    model-parallel stages, that of their stage), so its shard and slots go there too."""
    return bucket.group[local]


def _devices_of(variable: Any) -> tuple[str, ...]:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return tuple(part.device for part in getattr(value, "values", [value]))


def _launchers(strategy: tf.distribute.Strategy) -> list[Any]:
    extended = strategy.extended
    for collectives in (extended._cross_device_ops, getattr(extended, "_collective_ops", None)):
        if isinstance(collectives, cross_device_ops.CollectiveAllReduce):
            return list(collectives._launchers)
    raise ConfigError(
        "data_parallel.shard_optimizer_state=true needs collective all-reduce (ring); "
        f"{type(strategy).__name__} uses {type(extended._cross_device_ops).__name__}. "
        "Set communication.implementation to 'ring', or shard_optimizer_state to false."
    )


@dataclasses.dataclass
class _Replica:
    device: str
    replica: int
    optimizer: Any
    shards: list[ShardValue]
    slots: dict[str, Any]  # the replica optimizer's variables by name


@dataclasses.dataclass(frozen=True)
class SlotShards:
    """One slot as an unsharded optimizer has it, and the parts of it this task holds.

    Attributes:
        path: the unsharded slot's path (``adam/dense_kernel_momentum``).
        shape: the variable's (and the slot's) shape.
        dtype: its dtype.
        parts: ``(shard slot variable, piece)`` of every local replica that holds elements
            of it (``zero_plan.Piece``: where in the shard, which elements of the slot).
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    parts: list[tuple[Any, zero_plan.Piece]]


class ShardedState:
    """One optimizer's shards: a replica optimizer and its shards per local replica.

    Args:
        strategy: the strategy (cross-replica context).
        optimizer: the user's optimizer, built without slots.
        variables: the trainable variables it trains, in its order.
        wire: the dtype float32/float64 gradients are sent in by the reduce-scatter
            (``communication.compression`` fp16/bf16), or ``None`` for their own.
    """

    def __init__(self, strategy: tf.distribute.Strategy, optimizer: Any,
                 variables: Sequence[Any], wire: tf.DType | None = None) -> None:
        self.wire = wire
        self._index = {id(v): i for i, v in enumerate(variables)}
        self.slots: list[tuple[int, str]] = []  # (variable index, slot name), Keras's order
        self.slot_paths: list[str] = []
        self.replicas = strategy.num_replicas_in_sync
        specs = [zero_plan.VariableSpec(v.name, tuple(v.shape), tf.as_dtype(v.dtype).name,
                                        _devices_of(v)) for v in variables]
        self.plan = zero_plan.plan(specs, self.replicas)
        self.shapes = [tuple(v.shape) for v in variables]
        self.launchers = _launchers(strategy)
        devices = self.devices = strategy.extended.worker_devices
        first = strategy.extended._id_in_cluster * len(devices) if self.replicas > len(
            devices) else 0
        self.local = [self._replica(optimizer, i, first + i) for i in range(len(devices))]
        self.workers = self.replicas // len(devices)  # each holding its replicas' shards
        self.worker = first // len(devices)

    def _replica(self, optimizer: Any, local: int, replica: int) -> _Replica:
        """The replica optimizer of local replica ``local``: its scalars on the replica's
        (stage-0) device, each bucket's shard and slots where that replica holds the
        bucket's variables (their stage's device)."""
        device = self.devices[local]
        with _plain_variables(), tf.device(device):
            inner = type(optimizer).from_config(optimizer.get_config())
            inner._distribution_strategy = _ReplicaLocal()
            shards = [ShardValue(f"zero_shard_{b}_replica_{replica}", bucket.shard_size,
                                 bucket.dtype, bucket_device(bucket, local))
                      for b, bucket in enumerate(self.plan.buckets)]
            inner.build(shards)
        # The step count Adam's bias correction reads; set past Keras's tracking, which would
        # list the outer optimizer's (mirrored) counter among the replica optimizer's variables.
        object.__setattr__(inner, "_iterations", optimizer._iterations)
        return _Replica(device, replica, inner, shards, {v.name: v for v in inner.variables})

    def note_slot(self, optimizer: Any, reference: Any, name: str) -> None:
        """Records the slot ``name`` of ``reference`` (``ZeroSharding.note_slot``)."""
        self.slots.append((self._index[id(reference)], name))
        self.slot_paths.append(f"{optimizer.name}/{reference.path.replace('/', '_')}_{name}")

    def checkpoint_slots(self) -> list[SlotShards]:
        """Every slot an unsharded optimizer would have, in its order, with this task's parts."""
        where = {i: b for b, bucket in enumerate(self.plan.buckets) for i in bucket.indices}
        result = []
        for (index, name), path in zip(self.slots, self.slot_paths, strict=True):
            bucket = self.plan.buckets[where[index]]
            parts = []
            for state in self.local:
                shard = state.shards[where[index]]
                slot = state.slots[f"{shard.path.replace('/', '_')}_{name}"]
                parts += [(slot, piece) for piece in bucket.pieces(state.replica)
                          if piece.index == index]
            result.append(SlotShards(path, self.shapes[index], bucket.dtype, parts))
        return result

    # ------------------------------------------------------------------ the update

    def apply(self, grads: Sequence[Any], variables: Sequence[Any], learning_rate: Any,
              count: tuple[Any, float] | None = None) -> None:
        """One sharded update of ``variables`` by the replica's ``grads``, in a replica function.

        Args:
            grads: this replica's (clipped, not yet summed) gradients, one per variable.
            variables: the replicated variables (``tf.Variable`` values).
            learning_rate: the outer optimizer's learning rate now.
            count: ``(local examples, nominal global batch)`` for partial batches, or
                ``None``; the summed gradients are rescaled by ``nominal / total``.
        """
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        local = int(replica) % len(self.local)
        launcher, state = self.launchers[local], self.local[local]
        factor = None
        if count is not None:
            (total,) = all_reduce_sum([tf.cast(count[0], tf.float32)])
            factor = tf.math.divide_no_nan(tf.constant(count[1], tf.float32), total)
        for bucket, shard in zip(self.plan.buckets, state.shards, strict=True):
            with tf.device(bucket_device(bucket, local)):
                gradient = self._reduce_scattered(bucket, [grads[i] for i in bucket.indices],
                                                  launcher)
                if factor is not None:
                    gradient = gradient * tf.cast(factor, gradient.dtype)
                weights = self._chunks(bucket, [variables[i] for i in bucket.indices])
                with shard.bound(weights[int(replica)]):
                    state.optimizer.update_step(gradient, shard, learning_rate)
                    updated = tf.convert_to_tensor(shard)
                self._write_gathered(bucket, updated, [variables[i] for i in bucket.indices],
                                     launcher)

    def _chunks(self, bucket: zero_plan.Bucket, values: Sequence[Any]) -> tf.Tensor:
        """The bucket's flat values as ``[replicas, shard_size]``, each shard padded."""
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in values], 0)
        size = bucket.shard_size
        rows = [tf.pad(flat[start:start + length], [[0, size - length]])
                for start, length in zip(bucket.shard_starts(), bucket.shard_lengths(),
                                         strict=True)]
        return tf.stack(rows)

    def _reduce_scattered(self, bucket: zero_plan.Bucket, grads: Sequence[Any],
                          launcher: Any) -> tf.Tensor:
        chunks = self._chunks(bucket, [tf.cast(g, bucket.dtype) for g in grads])
        dtype = tf.as_dtype(bucket.dtype)
        if self.wire is None or dtype not in FLOATING:
            return tf.reduce_sum(_collective(collective_ops.all_to_all_v2, launcher, chunks), 0)
        sent = to_wire(chunks, self.wire, self.replicas)
        received = _collective(collective_ops.all_to_all_v2, launcher, sent)
        return tf.reduce_sum(from_wire(received, dtype, self.replicas), axis=0)

    def _write_gathered(self, bucket: zero_plan.Bucket, shard: tf.Tensor,
                        variables: Sequence[Any], launcher: Any) -> None:
        gathered = _collective(collective_ops.all_gather_v2, launcher, shard)
        rows = tf.reshape(gathered, [bucket.replicas, bucket.shard_size])
        flat = tf.concat([rows[r, :length] for r, length in enumerate(bucket.shard_lengths())],
                         0)
        for variable, value in zip(variables, tf.split(flat, list(bucket.sizes)), strict=True):
            local = variable._get_on_device_or_primary() if hasattr(
                variable, "_get_on_device_or_primary") else variable
            local.assign(tf.reshape(value, variable.shape))

    # ------------------------------------------------------------------ memory

    def replica_variables(self) -> Iterator[Any]:
        """Every variable of the replica optimizers (their slots and scalars)."""
        for state in self.local:
            yield from state.optimizer.variables


def _collective(op: Any, launcher: Any, value: tf.Tensor) -> tf.Tensor:
    """``op`` (all-to-all or all-gather) on ``launcher``'s group, ordered with its others."""
    instance_key = launcher._next_instance_key()
    options = launcher._options
    with tf.device(launcher._device):
        return op(value, launcher._group_size, launcher._group_key, instance_key,
                  communication_hint=options.implementation.value,
                  timeout=options.timeout_seconds, ordering_token=launcher._get_ordering_token())


"""Collectives over one (stage, shard) device of every replica, launched where values live.

Upstream (TF 2.21, ``CollectiveAllReduce`` in
``tensorflow/python/distribute/cross_device_ops.py``): a strategy's
collectives launch on its replica devices, one ``CollectiveReplicaLauncher``
each. With model-parallel stages or tensor-parallel shards a replica spans
several devices, and a value that lives on another of them (a later stage's
gradient, a shard's) is copied to the replica's device, all-reduced there and
copied back. ``batch_reduce_to`` with such destinations also reduces value by
value ("Efficient batch_reduce is not supported if destinations are
different") and hands every destination replica 0's result.

``device_groups`` gives one ``CollectiveAllReduce`` per (stage, shard) of the
mesh, over that position's device in every local replica: same group size,
options and ``CollectiveKeys`` as the strategy's own (so its group keys are
new to this process), made for every position in mesh order the first time
any is asked for, which makes the keys agree across workers. (stage 0,
shard 0) is the strategy's own.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops

from hybridpar.topology.mesh import DeviceMesh

_ATTRIBUTE = "_hybridpar_device_groups"

DeviceGroups = dict[frozenset[str], cross_device_ops.CollectiveAllReduce]


def strategy_collectives(strategy: tf.distribute.Strategy
                         ) -> cross_device_ops.CollectiveAllReduce | None:
    """The strategy's ``CollectiveAllReduce`` (its cross-device ops, or the fallback
    MirroredStrategy keeps for replica-context all-reduces), or ``None``."""
    extended = strategy.extended
    for collectives in (getattr(extended, "_cross_device_ops", None),
                        getattr(extended, "_collective_ops", None)):
        if isinstance(collectives, cross_device_ops.CollectiveAllReduce):
            return collectives
    return None


def _on_worker(leader: str, local: str) -> str:
    """``local`` (``/device:CPU:1``) on the worker of ``leader`` (a full device name)."""
    spec = tf.DeviceSpec.from_string(local)
    return tf.DeviceSpec.from_string(leader).replace(
        device_type=spec.device_type, device_index=spec.device_index).to_string()


def device_groups(strategy: tf.distribute.Strategy, mesh: DeviceMesh) -> DeviceGroups:
    """The collectives of each (stage, shard) of ``mesh``, keyed by its local devices.

    Args:
        strategy: a hybridpar strategy whose replicas are ``mesh``'s.
        mesh: the strategy's device mesh (this worker's devices).

    Returns:
        ``{frozenset(mesh.shard_devices(stage, shard)): CollectiveAllReduce}``,
        empty when the strategy has no ``CollectiveAllReduce``.
    """
    known = getattr(strategy, _ATTRIBUTE, None)
    if known is not None:
        return known
    own = strategy_collectives(strategy)
    groups: DeviceGroups = {}
    if own is not None and len(own._devices) == mesh.replicas:
        for stage in range(mesh.stages):
            for shard in range(mesh.tensor):
                local = mesh.shard_devices(stage, shard)
                groups[frozenset(local)] = own if (stage, shard) == (0, 0) else (
                    cross_device_ops.CollectiveAllReduce(
                        [_on_worker(leader, d) for leader, d in zip(own._devices, local,
                                                                    strict=True)],
                        own._group_size, options=own._options,
                        collective_keys=own._collective_keys,
                        canonicalize_devices=own._canonicalize_devices))
    setattr(strategy, _ATTRIBUTE, groups)
    return groups


def launcher_for(strategy: tf.distribute.Strategy, mesh: DeviceMesh, devices: frozenset[str],
                 local_replica: int) -> Any:
    """The ``CollectiveReplicaLauncher`` of ``local_replica`` in the group over ``devices``
    (``None`` when the mesh has no such group)."""
    group = device_groups(strategy, mesh).get(devices)
    return None if group is None else group._launchers[local_replica]

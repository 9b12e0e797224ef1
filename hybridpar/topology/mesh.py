"""Devices arranged as replicas x stages x tensor-parallel shards (pure Python).

Mapping: the devices are taken in the order given, replica-major, then stage,
then shard, so replica ``r`` stage ``s`` shard ``t`` is
``devices[(r * stages + s) * tensor + t]``. With 4 devices and 2 stages,
replica 0 runs on devices 0 and 1, replica 1 on devices 2 and 3; stage 0 of
every replica (devices 0 and 2) holds the mirrored copies of stage 0's
variables. Keeping a replica's stages adjacent keeps pipeline traffic between
neighbouring devices (e.g. GPUs on one switch), and a tensor-parallel group,
whose all-reduces run in every layer, innermost. Shard 0 of a stage is its
leader: the device ``device(replica, stage)`` names, where the stage's
unsplit weights and ops go.
"""

from __future__ import annotations

import dataclasses

from hybridpar.errors import RuntimeMismatchError


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """A replicas x stages x tensor grid of local device names."""

    devices: tuple[str, ...]
    stages: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        per_replica = self.stages * self.tensor
        if min(self.stages, self.tensor) < 1 or not self.devices or (
                len(self.devices) % per_replica):
            raise RuntimeMismatchError(
                f"{len(self.devices)} devices do not divide into stages={self.stages} x "
                f"tensor={self.tensor} devices per replica. Received: "
                f"devices={list(self.devices)}. Use a number of devices that is a "
                f"multiple of {per_replica}."
            )

    @property
    def replicas(self) -> int:
        """Number of data-parallel replicas."""
        return len(self.devices) // (self.stages * self.tensor)

    def device(self, replica: int, stage: int, shard: int = 0) -> str:
        """The device of ``shard`` of ``stage`` in ``replica`` (shard 0: the stage's leader)."""
        if not (0 <= replica < self.replicas and 0 <= stage < self.stages
                and 0 <= shard < self.tensor):
            raise IndexError(
                f"No device at replica={replica}, stage={stage}, shard={shard} in a "
                f"{self.replicas} x {self.stages} x {self.tensor} mesh."
            )
        return self.devices[(replica * self.stages + stage) * self.tensor + shard]

    def replica_devices(self, replica: int) -> tuple[str, ...]:
        """The leader device of each stage of one replica, stage 0 first."""
        return tuple(self.device(replica, s) for s in range(self.stages))

    def group_devices(self, replica: int, stage: int) -> tuple[str, ...]:
        """The tensor-parallel group of ``stage`` in ``replica``, shard 0 first."""
        return tuple(self.device(replica, stage, t) for t in range(self.tensor))

    def shard_devices(self, stage: int, shard: int) -> tuple[str, ...]:
        """The devices holding ``shard`` of ``stage`` in every replica, replica 0 first."""
        return tuple(self.device(r, stage, shard) for r in range(self.replicas))

    def stage_devices(self, stage: int) -> tuple[str, ...]:
        """The devices holding ``stage`` in every replica, replica 0 first."""
        return tuple(self.device(r, stage) for r in range(self.replicas))

"""Devices arranged as replicas x stages (pure Python).

Mapping: the devices are taken in the order given, replica-major, so replica
``r`` stage ``s`` is ``devices[r * stages + s]``. With 4 devices and 2 stages,
replica 0 runs on devices 0 and 1, replica 1 on devices 2 and 3; stage 0 of
every replica (devices 0 and 2) holds the mirrored copies of stage 0's
variables. Keeping a replica's stages adjacent keeps pipeline traffic between
neighbouring devices (e.g. GPUs on one switch).
"""

from __future__ import annotations

import dataclasses

from hybridpar.errors import RuntimeMismatchError


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """A replicas x stages grid of local device names."""

    devices: tuple[str, ...]
    stages: int = 1

    def __post_init__(self) -> None:
        if self.stages < 1 or not self.devices or len(self.devices) % self.stages:
            raise RuntimeMismatchError(
                f"{len(self.devices)} devices do not divide into stages={self.stages} "
                f"devices per replica. Received: devices={list(self.devices)}. Use a "
                f"number of devices that is a multiple of {self.stages}."
            )

    @property
    def replicas(self) -> int:
        """Number of data-parallel replicas."""
        return len(self.devices) // self.stages

    def device(self, replica: int, stage: int) -> str:
        """The device of ``stage`` in ``replica``."""
        if not (0 <= replica < self.replicas and 0 <= stage < self.stages):
            raise IndexError(
                f"No device at replica={replica}, stage={stage} in a "
                f"{self.replicas} x {self.stages} mesh."
            )
        return self.devices[replica * self.stages + stage]

    def replica_devices(self, replica: int) -> tuple[str, ...]:
        """The devices of one replica, stage 0 first."""
        return tuple(self.device(replica, s) for s in range(self.stages))

    def stage_devices(self, stage: int) -> tuple[str, ...]:
        """The devices holding ``stage`` in every replica, replica 0 first."""
        return tuple(self.device(r, stage) for r in range(self.replicas))

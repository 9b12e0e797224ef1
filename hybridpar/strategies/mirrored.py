"""hybridpar's single-device and mirrored strategies.

Both create each model-parallel stage's variables on that stage's devices
(``staged_variables``). The mirrored one also has collective keys of
its own (``collective_keys``), splits uneven batches evenly over its
replicas (``even_batches``) and weights each replica's loss by its
share of the examples (``compat.replica_share``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import (
    collective_util,
    cross_device_utils,
    distribute_lib,
    mirrored_strategy,
    one_device_strategy,
)
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.eager import def_function

from hybridpar.compat import replica_share
from hybridpar.state import OwnedStrategy, StrategyState
from hybridpar.strategies import collective_keys, even_batches, staged_variables


class StagedExtended:
    """Mixin of the ``extended`` objects of hybridpar's strategies.

    Variables go to their layer's stage devices, and replica functions run
    with their batch's share of the examples.
    """

    def _hybridpar_state(self) -> StrategyState:
        return self._container_strategy().hybridpar_state

    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        kwargs = staged_variables.placed(self._hybridpar_state().placer, kwargs)
        return super()._create_variable(next_creator, **kwargs)

    def _call_for_each_replica(self, fn: Any, args: Any, kwargs: Any) -> Any:
        if not isinstance(fn, def_function.Function):  # a tf.function is traced per replica
            state = self._hybridpar_state()
            fn = replica_share.weighted_by_share(
                fn, state.global_batch_size, guard_empty=state.mode == "multi_worker"
            )
        return super()._call_for_each_replica(fn, args, kwargs)


class _OneDeviceExtended(StagedExtended, one_device_strategy.OneDeviceExtended):
    pass


class _MirroredExtended(StagedExtended, mirrored_strategy.MirroredExtended):
    pass


class HybridOneDeviceStrategy(OwnedStrategy, tf.distribute.OneDeviceStrategy):
    """``mode: none``: one replica, on the first device (with stages, over several)."""

    def __init__(self, state: StrategyState, device: str) -> None:
        self.hybridpar_state = state
        tf.distribute.Strategy.__init__(self, _OneDeviceExtended(self, device))
        distribute_lib.distribution_strategy_gauge.get_cell("V2").set("OneDeviceStrategy")

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        found = even_batches.distribute_resumably(self, dataset)
        if found is not None:
            return found
        return super().experimental_distribute_dataset(dataset, options)


class HybridMirroredStrategy(OwnedStrategy, tf.distribute.MirroredStrategy):
    """``mode: mirrored``: one replica per stage-0 device of the mesh.

    Args:
        state: hybridpar's state of this strategy.
        devices: the replica devices.
        ring: force RING collectives (TensorFlow's default is NCCL on GPUs
            and RING on CPUs).
    """

    def __init__(self, state: StrategyState, devices: tuple[str, ...], ring: bool = False) -> None:
        self.hybridpar_state = state
        self._collective_key_base = collective_keys.next_key_base()
        cross_device_ops = None
        if ring:
            cross_device_ops = cross_device_ops_lib.CollectiveAllReduce(
                devices=list(devices),
                group_size=len(devices),
                options=collective_util.Options(
                    implementation=collective_util.CommunicationImplementation.RING
                ),
                collective_keys=cross_device_utils.CollectiveKeys(
                    group_key_start=1 + self._collective_key_base
                ),
            )
        extended = _MirroredExtended(self, devices=list(devices), cross_device_ops=cross_device_ops)
        tf.distribute.Strategy.__init__(self, extended)
        distribute_lib.distribution_strategy_gauge.get_cell("V2").set("MirroredStrategy")

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        found = even_batches.distribute_resumably(self, dataset)
        if found is not None:
            return found
        return even_batches.distribute_evenly(
            self, dataset, options, super().experimental_distribute_dataset
        )

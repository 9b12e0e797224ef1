"""hybridpar's MultiWorkerMirroredStrategy: synchronous training across the workers of a cluster.

Besides the mirrored strategies' behaviour (stage placement, replica shares,
own collective keys, balanced batches), it shards each dataset over the
workers by ``data.shard_policy`` and, when this process already joined the cluster
(``cluster_join``), joins the running server instead of restarting it
(``collective_restart``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute.collective_all_reduce_strategy import (
    CollectiveAllReduceExtended,
)

from hybridpar.config import StrategyConfig
from hybridpar.data import sharding
from hybridpar.state import OwnedStrategy, StrategyState
from hybridpar.strategies import cluster_join, collective_keys, collective_restart, even_batches
from hybridpar.strategies.mirrored import StagedExtended

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def communication_options(
    config: StrategyConfig,
) -> tf.distribute.experimental.CommunicationOptions:
    """The config's collective implementation and timeout."""
    return tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[config.communication.implementation],
        timeout_seconds=config.communication.timeout_seconds,
    )


class _CollectiveExtended(StagedExtended, CollectiveAllReduceExtended):
    def __init__(self, container_strategy: Any, communication_options: Any,
                 server_running: bool) -> None:
        if server_running:
            collective_restart.mark_server_started(self)
        super().__init__(
            container_strategy, cluster_resolver=None, communication_options=communication_options
        )


class HybridMultiWorkerMirroredStrategy(OwnedStrategy, tf.distribute.MultiWorkerMirroredStrategy):
    """``mode: multi_worker`` on the cluster in TF_CONFIG (or one local worker without it).

    Args:
        state: hybridpar's state of this strategy.
        server_running: whether this process already joined the cluster.
    """

    def __init__(self, state: StrategyState, server_running: bool) -> None:
        self.hybridpar_state = state
        self._collective_key_base = collective_keys.next_key_base()
        extended = _CollectiveExtended(
            self, communication_options(state.config), server_running=server_running
        )
        tf.distribute.Strategy.__init__(self, extended)
        distribute_lib.distribution_strategy_gauge.get_cell("V2").set(
            "MultiWorkerMirroredStrategy"
        )

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        state = self.hybridpar_state
        if not isinstance(dataset, tf.data.Dataset):
            return super().experimental_distribute_dataset(dataset, options)
        cluster = state.cluster
        workers = cluster.num_workers if cluster is not None else 1
        policy = sharding.chosen_policy(dataset, workers, state.config.data.shard_policy)
        worker = even_batches.WorkerInput(
            worker_id=cluster.worker_id if cluster is not None else 0,
            num_workers=workers,
            policy=policy,
        )
        dataset = sharding.with_policy(dataset, policy)
        found = even_batches.distribute_resumably(self, dataset, worker)
        if found is not None:
            return found
        return even_batches.distribute_evenly(
            self, dataset, options, super().experimental_distribute_dataset, worker,
        )


def build(state: StrategyState) -> HybridMultiWorkerMirroredStrategy:
    """The multi-worker strategy for ``state``'s config, on the cluster that is up.

    The evaluator task never gets here: its plan is local (``topology.plan``),
    which also refused a cluster with ps tasks. Joining is a no-op when
    ``hybridpar.initialize()`` already joined this cluster.
    """
    cluster = state.cluster
    if cluster is not None:
        cluster_join.bring_up(cluster)
    return HybridMultiWorkerMirroredStrategy(state, server_running=cluster is not None)

"""hybridpar's ParameterServerStrategy: the chief coordinates, workers compute, ps tasks hold.

Every task runs the same script. On ``worker`` and ``ps`` tasks ``build``
starts the task's ``tf.distribute.Server`` and blocks (``serve``); only the
chief returns, with a ``HybridParameterServerStrategy`` whose ``fit``,
``evaluate`` and ``predict`` run through ``ps_training`` (see
``compat.runner_routing``). Variables split by ``parameter_server.partitioner``
are ``ShardedVariable``s over the ps tasks. An ``evaluator`` task in the
cluster is left out of the chief's view (``ps_evaluator_job``).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import tensorflow as tf

from hybridpar.config import PartitionerConfig
from hybridpar.state import OwnedStrategy, StrategyState
from hybridpar.strategies import ps_chief, ps_evaluator_job
from hybridpar.strategies.ps_training import ParameterServerRunner
from hybridpar.topology.cluster import ClusterInfo

logger = logging.getLogger("hybridpar")


def make_partitioner(partitioner: PartitionerConfig | None) -> Any:
    """The ``tf.distribute.experimental.partitioners`` object for the config, or None."""
    if partitioner is None:
        return None
    partitioners = tf.distribute.experimental.partitioners
    if partitioner.kind == "fixed":
        return partitioners.FixedShardsPartitioner(partitioner.shards)
    return partitioners.MinSizePartitioner(
        min_shard_bytes=partitioner.min_shard_bytes, max_shards=partitioner.max_shards
    )


def serve(cluster: ClusterInfo) -> NoReturn:
    """Runs this worker or ps task's server until the process is stopped."""
    logger.info(
        "hybridpar: %s:%d serving the parameter-server cluster (stops when the cluster ends)",
        cluster.task_type,
        cluster.task_index,
    )
    spec = tf.train.ClusterSpec({job: list(tasks) for job, tasks in cluster.jobs.items()})
    server = tf.distribute.Server(
        spec, job_name=cluster.task_type, task_index=cluster.task_index, protocol="grpc"
    )
    server.join()
    raise SystemExit(0)  # pragma: no cover  (join() returns only if the server is stopped)


class HybridParameterServerStrategy(
    OwnedStrategy, tf.distribute.experimental.ParameterServerStrategy
):
    """The chief's ``ParameterServerStrategy``, with its ``ClusterCoordinator`` in ``runner``.

    Inside ``ps_chief.on_chief(strategy)`` (the chief's own evaluate
    and predict) datasets are handed to Keras unchanged: a parameter-server
    strategy's distributed dataset can only be iterated on workers.
    """

    def __init__(self, state: StrategyState) -> None:
        self.hybridpar_state = state
        partitioner = make_partitioner(state.config.parameter_server.partitioner)
        resolver = ps_evaluator_job.training_resolver(state.cluster)
        super().__init__(resolver, variable_partitioner=partitioner)

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        if ps_chief.is_on_chief(self):
            return dataset
        return super().experimental_distribute_dataset(dataset, options)


def build(state: StrategyState) -> HybridParameterServerStrategy:
    """The chief's strategy and its coordinator; on worker and ps tasks this never returns.

    The evaluator task never gets here: its plan is local (``topology.plan``),
    which also checked that the cluster can train this way.
    """
    cluster = state.cluster
    assert cluster is not None, "make_plan refuses parameter_server without a cluster"
    if cluster.task_type in ("worker", "ps"):
        serve(cluster)
    strategy = HybridParameterServerStrategy(state)
    state.runner = ParameterServerRunner(strategy, cluster)
    return strategy

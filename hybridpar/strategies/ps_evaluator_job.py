"""The parameter-server chief connects to the training tasks only, never to the evaluator.

Upstream (TF 2.21, ``ParameterServerStrategyV2._connect_to_cluster``): the
chief connects to every task of the cluster in ``TF_CONFIG``. With an
``evaluator`` job in it (the usual shape of a cluster with sidecar
evaluation; Kubeflow and ``hybridpar launch --evaluator`` write it) and the
evaluator running no server, the strategy's constructor hangs
(tensorflow/tensorflow#46169; the maintainers' answer: training and
evaluation are separate clusters). hybridpar's parameter-server strategy is
given a resolver of the cluster without the evaluator job. An override: only
``HybridParameterServerStrategy`` calls ``training_resolver``.
"""

from __future__ import annotations

import tensorflow as tf

from hybridpar.topology.cluster import ClusterInfo


def training_resolver(cluster: ClusterInfo) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A resolver of this task in the cluster's training jobs (chief, worker, ps)."""
    spec = tf.train.ClusterSpec({job: list(tasks) for job, tasks in cluster.training_jobs.items()})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=cluster.task_type, task_id=cluster.task_index, rpc_layer="grpc"
    )

"""Bringing this task into its multi-worker cluster, before any TensorFlow op runs.

TensorFlow refuses to start collective ops once any op has run ("Collective
ops must be configured at program startup"), yet users build their tf.data
pipeline before they enter a strategy scope. So ``hybridpar.initialize()``
(which ``import hybridpar`` calls when ``TF_CONFIG`` names a cluster) brings a
task of a multi-worker cluster into it (``bring_up``) before the user's code
runs any op; ``hybridpar.scope()`` later builds the strategy with the config's
communication options on the cluster that is already up.
"""

from __future__ import annotations

import hashlib
import json
import logging

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from hybridpar.compat.versions import check_versions
from hybridpar.errors import ConfigError
from hybridpar.topology.cluster import ClusterInfo

logger = logging.getLogger("hybridpar")

REGISTER_TIMEOUT_SECONDS = 120
_SPEC_KEY = "hybridpar/cluster_spec_hash/"

_cluster_up: ClusterInfo | None = None


def is_up() -> bool:
    """True once this process joined its cluster."""
    return _cluster_up is not None


def spec_hash(cluster: ClusterInfo) -> str:
    """A short, order-stable hash of the cluster's jobs and addresses."""
    canonical = json.dumps({job: list(tasks) for job, tasks in sorted(cluster.jobs.items())})
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _configure_coordination(cluster: ClusterInfo, register_timeout_s: int) -> None:
    """Coordination service with a registration timeout, so a cluster that
    cannot form (wrong addresses, a missing task) errors instead of hanging."""
    spec = multi_worker_util.normalize_cluster_spec(
        {job: list(tasks) for job, tasks in cluster.jobs.items()}
    )
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(cluster.jobs[job]))
        for job in ("chief", "worker")
        if job in cluster.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        cluster_register_timeout_in_ms=register_timeout_s * 1000,
        coordinated_jobs=jobs,
    )


def _check_same_spec(cluster: ClusterInfo, timeout_s: int) -> None:
    """Every task publishes its spec hash; each compares all of them.

    Raises:
        ConfigError: naming the tasks whose TF_CONFIG cluster differs.
    """
    mine = spec_hash(cluster)
    ctx = context.context()
    ctx.set_config_key_value(f"{_SPEC_KEY}{cluster.task}", mine)
    differing = []
    for job in ("chief", "worker"):
        for index in range(len(cluster.jobs.get(job, ()))):
            theirs = ctx.get_config_key_value(
                f"{_SPEC_KEY}{job}:{index}", timeout_in_ms=timeout_s * 1000
            )
            if theirs != mine:
                differing.append(f"{job}:{index} ({theirs})")
    if differing:
        raise ConfigError(
            f"TF_CONFIG cluster specs differ between tasks: this task {cluster.task} "
            f"has spec hash {mine}, but {', '.join(differing)} differ. Give every task the "
            "same 'cluster' (only 'task' may differ); `hybridpar tf-config` prints them."
        )


def bring_up(cluster: ClusterInfo, register_timeout_s: int = REGISTER_TIMEOUT_SECONDS) -> None:
    """Starts this task's server and joins the cluster (once per process).

    Call it before any TensorFlow op runs; ``hybridpar.initialize()`` does
    on a chief or worker of a multi-worker cluster.

    Raises:
        ConfigError: when ops already ran, the cluster cannot form, or the
            tasks were given different cluster specs.
    """
    global _cluster_up
    if _cluster_up is not None:
        if _cluster_up != cluster:
            raise ConfigError(
                f"This process already joined cluster {dict(_cluster_up.jobs)} as "
                f"{_cluster_up.task}; TF_CONFIG now says {dict(cluster.jobs)} as "
                f"{cluster.task}. A process can join one cluster only."
            )
        return
    check_versions()
    try:
        _configure_coordination(cluster, register_timeout_s)
        tf.distribute.MultiWorkerMirroredStrategy()
    except RuntimeError as err:
        if "program startup" in str(err):
            raise ConfigError(
                "TensorFlow already ran an op in this process, so it cannot join the "
                f"multi-worker cluster in TF_CONFIG any more ({err}). Set TF_CONFIG before "
                "the program starts and put `import hybridpar` above the first TensorFlow "
                "op (dataset, tensor or model) of your script."
            ) from None
        raise
    except tf.errors.DeadlineExceededError as err:
        raise ConfigError(
            f"The cluster in TF_CONFIG did not form within {register_timeout_s} s "
            f"({err.message.splitlines()[0]}). Check that every task is running and that "
            f"all got the same TF_CONFIG cluster (this task: {cluster.task}, spec "
            f"hash {spec_hash(cluster)})."
        ) from None
    _check_same_spec(cluster, register_timeout_s)
    _cluster_up = cluster
    logger.info("hybridpar: joined cluster as %s (spec %s)", cluster.task, spec_hash(cluster))

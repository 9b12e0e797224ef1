"""Multi-worker synchronous training: cluster bring-up, the strategy, input sharding.

TensorFlow refuses to start collective ops once any op has run ("Collective
ops must be configured at program startup"), yet users build their tf.data
pipeline before they enter a strategy scope. So when ``TF_CONFIG`` names a
multi-worker cluster, ``import hybridpar`` brings this task into the cluster
(``bring_up``) before the user's code runs any op; ``hybridpar.scope()``
later builds the strategy with the config's communication options on the
cluster that is already up.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from hybridpar import keras_compat
from hybridpar.cluster import ClusterInfo
from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError

logger = logging.getLogger("hybridpar")

REGISTER_TIMEOUT_SECONDS = 120
_SPEC_KEY = "hybridpar/cluster_spec_hash/"
_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}

_cluster_up: ClusterInfo | None = None
_said: set[str] = set()


def spec_hash(cluster: ClusterInfo) -> str:
    """A short, order-stable hash of the cluster's jobs and addresses."""
    canonical = json.dumps({job: list(tasks) for job, tasks in sorted(cluster.jobs.items())})
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def task_name(cluster: ClusterInfo) -> str:
    return f"{cluster.task_type}:{cluster.task_index}"


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
    ctx.set_config_key_value(_SPEC_KEY + task_name(cluster), mine)
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
            f"TF_CONFIG cluster specs differ between tasks: this task {task_name(cluster)} "
            f"has spec hash {mine}, but {', '.join(differing)} differ. Give every task the "
            "same 'cluster' (only 'task' may differ); `hybridpar tf-config` prints them."
        )


def bring_up(cluster: ClusterInfo, register_timeout_s: int = REGISTER_TIMEOUT_SECONDS) -> None:
    """Starts this task's server and joins the cluster (once per process).

    Call it before any TensorFlow op runs; ``import hybridpar`` does when
    TF_CONFIG names a multi-worker cluster.

    Raises:
        ConfigError: when ops already ran, the cluster cannot form, or the
            tasks were given different cluster specs.
    """
    global _cluster_up
    if _cluster_up is not None:
        if _cluster_up != cluster:
            raise ConfigError(
                f"This process already joined cluster {dict(_cluster_up.jobs)} as "
                f"{task_name(_cluster_up)}; TF_CONFIG now says {dict(cluster.jobs)} as "
                f"{task_name(cluster)}. A process can join one cluster only."
            )
        return
    keras_compat.check_versions()
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
            f"all got the same TF_CONFIG cluster (this task: {task_name(cluster)}, spec "
            f"hash {spec_hash(cluster)})."
        ) from None
    _check_same_spec(cluster, register_timeout_s)
    _cluster_up = cluster
    logger.info("hybridpar: joined cluster as %s (spec %s)", task_name(cluster), spec_hash(cluster))


def communication_options(
    config: StrategyConfig,
) -> tf.distribute.experimental.CommunicationOptions:
    """The config's collective implementation and timeout."""
    return tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[config.communication.implementation],
        timeout_seconds=config.communication.timeout_seconds,
    )


def build_strategy(
    config: StrategyConfig, cluster: ClusterInfo | None
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The MultiWorkerMirroredStrategy for ``config`` on the cluster that is up."""
    if cluster is not None and cluster.num_ps:
        raise ConfigError(
            f"data_parallel.mode='multi_worker' cannot use a cluster with 'ps' tasks "
            f"(TF_CONFIG lists {cluster.num_ps}). Use mode 'parameter_server' (or 'auto'), "
            "or remove the ps job."
        )
    if cluster is not None and cluster.task_type not in ("chief", "worker"):
        raise ConfigError(
            f"Task {task_name(cluster)} does not train in mode 'multi_worker'; only chief "
            "and worker tasks run hybridpar.scope()."
        )
    if cluster is not None:
        bring_up(cluster)
    strategy = keras_compat.multi_worker_strategy(
        communication_options(config), server_running=cluster is not None
    )
    distribute = strategy.experimental_distribute_dataset
    workers = cluster.num_workers if cluster is not None else 1
    policy = config.data.shard_policy

    def experimental_distribute_dataset(dataset, options=None):
        return distribute(shard_dataset(dataset, workers, policy), options)

    strategy.experimental_distribute_dataset = experimental_distribute_dataset
    return strategy


def describe_sharding(policy: str, files: int | None, workers: int) -> tuple[str, str]:
    """Resolves ``data.shard_policy`` for an input (pure logic).

    Returns:
        The chosen policy (``file``, ``data`` or ``off``) and why.
    """
    if policy != "auto":
        return policy, f"data.shard_policy={policy}"
    if files is not None and files >= workers:
        return "file", f"file-based input with {files} files >= {workers} workers"
    if files is None:
        return "data", "the input is not read from files"
    return "data", f"only {files} input file(s) for {workers} workers"


def input_files(dataset: tf.data.Dataset) -> int | None:
    """How many files a dataset reads, or ``None`` when it reads none.

    Looks for file-reading datasets in the dataset's graph and counts the
    file names in the string constants that feed them.
    """
    from hybridpar.batching import dataset_graph

    graph = dataset_graph(dataset)
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    readers = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
               "ArrayRecordDataset")
    if not any(node.op.startswith(readers) for node in nodes):
        return None
    counts = []
    for node in nodes:
        if node.op == "Const" and node.attr["dtype"].type == tf.string.as_datatype_enum:
            tensor = node.attr["value"].tensor
            dims = [d.size for d in tensor.tensor_shape.dim]
            if len(dims) == 1:
                counts.append(dims[0])
    return max(counts) if counts else 1


def shard_dataset(dataset: Any, num_workers: int, policy: str) -> Any:
    """Sets the auto-shard policy of a dataset and says which it chose (once)."""
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    chosen, why = describe_sharding(policy, input_files(dataset), num_workers)
    message = f"hybridpar: sharding the input by {chosen.upper()} over {num_workers} workers"
    message += f" ({why})."
    if message not in _said:
        _said.add(message)
        logger.info(message)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "file": tf.data.experimental.AutoShardPolicy.FILE,
        "data": tf.data.experimental.AutoShardPolicy.DATA,
        "off": tf.data.experimental.AutoShardPolicy.OFF,
    }[chosen]
    return dataset.with_options(options)

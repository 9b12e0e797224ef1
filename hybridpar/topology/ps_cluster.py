"""What a parameter-server cluster needs, and reading its failures (pure Python).

``plan.make_plan`` runs :func:`check_cluster` before any strategy is built;
``hybridpar.strategies.ps_training`` uses the rest to name a lost ps task.
"""

from __future__ import annotations

import re

from hybridpar.config import PartitionerConfig, StrategyConfig
from hybridpar.errors import RuntimeMismatchError
from hybridpar.topology.cluster import ClusterInfo

PS_TASK = re.compile(r"/job:ps/replica:0/task:(\d+)")


def check_cluster(cluster: ClusterInfo | None, config: StrategyConfig) -> ClusterInfo:
    """Checks that the cluster can run parameter-server training (pure logic).

    Raises:
        RuntimeMismatchError: without a cluster, without a chief or ps tasks,
            without workers, or with more shards than ps tasks.
    """
    launch = "hybridpar launch --workers 2 --ps 2 -- python train.py"
    if cluster is None:
        raise RuntimeMismatchError(
            "data_parallel.mode='parameter_server' needs a cluster with chief, worker and ps "
            f"tasks in TF_CONFIG, but TF_CONFIG is not set. Start it with `{launch}`."
        )
    jobs = ", ".join(f"{job}={len(tasks)}" for job, tasks in cluster.jobs.items())
    for job, why in (("chief", "the chief coordinates training"),
                     ("ps", "the ps tasks hold the variables"),
                     ("worker", "the workers run the training steps")):
        if not cluster.jobs.get(job):
            raise RuntimeMismatchError(
                f"data_parallel.mode='parameter_server' needs a {job!r} job in TF_CONFIG "
                f"({why}). Received: {jobs}. Add the {job!r} job to TF_CONFIG's cluster, or "
                f"start the cluster with `{launch}`."
            )
    check_partitioner(config.parameter_server.partitioner, cluster.num_ps)
    return cluster


def check_partitioner(partitioner: PartitionerConfig | None, num_ps: int) -> None:
    """Raises when the partitioner asks for more shards than there are ps tasks."""
    if partitioner is None:
        return
    shards = partitioner.shards if partitioner.kind == "fixed" else partitioner.max_shards
    key = "shards" if partitioner.kind == "fixed" else "max_shards"
    if shards > num_ps:
        raise RuntimeMismatchError(
            f"parameter_server.partitioner.{key}={shards} but the cluster has {num_ps} ps "
            f"task(s); each shard lives on its own ps. Set {key} to at most {num_ps}, or "
            f"start more ps tasks (hybridpar launch --ps {shards})."
        )


def ps_tasks_in(message: str, cluster: ClusterInfo) -> list[str]:
    """``ps:I (host:port)`` for every ps task an error message names by job or address."""
    addresses = cluster.jobs.get("ps", ())
    found = {int(i) for i in PS_TASK.findall(message)}
    for i, address in enumerate(addresses):
        if re.search(re.escape(address) + r"(?!\d)", message):
            found.add(i)
    return [f"ps:{i} ({addresses[i]})" if i < len(addresses) else f"ps:{i}" for i in sorted(found)]


def root_cause(message: str) -> str:
    """The line of a TensorFlow error message that says what failed (pure logic)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if "UNAVAILABLE" in line or "Unavailable" in line or "Connection" in line:
            return line.removeprefix("(0) ").strip()
    return lines[0] if lines else ""

"""The cluster a process belongs to, read from ``TF_CONFIG`` (pure Python).

``TF_CONFIG`` is TensorFlow's own JSON description of a cluster::

    {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"], "ps": ["h2:2222"]},
     "task": {"type": "worker", "index": 0}}

This module parses and validates it up front so that a bad value fails with a
message naming TF_CONFIG instead of hanging inside the gRPC runtime.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from hybridpar.config import did_you_mean
from hybridpar.errors import ConfigError

JOB_TYPES = ("chief", "worker", "ps", "evaluator")


class Task(NamedTuple):
    """One task of a cluster, e.g. ``Task("worker", 1)``, printed as ``worker:1``."""

    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


def cluster_spec(tasks: Sequence[Task], addresses: Sequence[str]) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: job name -> addresses, in task-index order."""
    if len(tasks) != len(addresses):
        raise ValueError(f"{len(tasks)} tasks but {len(addresses)} addresses.")
    spec: dict[str, list[str]] = {}
    for task, address in sorted(zip(tasks, addresses, strict=True), key=lambda p: p[0].index):
        spec.setdefault(task.type, []).append(address)
    order = {name: i for i, name in enumerate(JOB_TYPES)}
    return {job: spec[job] for job in sorted(spec, key=lambda j: order.get(j, len(order)))}


def tf_config(jobs: Mapping[str, Sequence[str]], task: Task) -> dict:
    """The TF_CONFIG value (as a dict) of ``task`` in the cluster ``jobs``.

    Jobs without tasks are left out. Validation of user input is the
    caller's (``parse_tf_config`` reads a value back with every check).
    """
    return {
        "cluster": {job: list(addresses) for job, addresses in jobs.items() if addresses},
        "task": {"type": task.type, "index": task.index},
    }


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated ``TF_CONFIG``.

    Attributes:
        jobs: job name -> task addresses.
        task_type: this process's job.
        task_index: this process's index in its job.
    """

    jobs: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Tasks that train: the chief plus the workers."""
        return len(self.jobs.get("chief", ())) + len(self.jobs.get("worker", ()))

    @property
    def num_ps(self) -> int:
        """Parameter-server tasks."""
        return len(self.jobs.get("ps", ()))

    @property
    def runs_collectives(self) -> bool:
        """True for a chief or worker of a multi-worker cluster without ps tasks.

        Such a task all-reduces with collective ops, which TensorFlow
        configures only at program startup (``hybridpar.initialize``).
        """
        return (self.num_ps == 0 and self.num_workers > 1
                and self.task_type in ("chief", "worker"))

    @property
    def is_evaluator(self) -> bool:
        """True for the ``evaluator`` task: it evaluates checkpoints and never trains."""
        return self.task_type == "evaluator"

    @property
    def training_jobs(self) -> dict[str, tuple[str, ...]]:
        """The jobs without the evaluator: the cluster the training tasks form.

        TensorFlow keeps the evaluator out of the training cluster
        (``multi_worker_util``: "the evaluator is in its own cluster").
        """
        return {job: tasks for job, tasks in self.jobs.items() if job != "evaluator"}

    @property
    def task(self) -> Task:
        """This process's task, printed as ``worker:1``."""
        return Task(self.task_type, self.task_index)

    @property
    def worker_id(self) -> int:
        """This training task's position among the training tasks, the chief first.

        It is TensorFlow's ``multi_worker_util.id_in_cluster``: the replicas of
        worker ``i`` are the ``i``-th group of the strategy's replicas.

        Raises:
            ValueError: on a task that does not train (ps, evaluator).
        """
        if self.task_type == "chief":
            return 0
        if self.task_type != "worker":
            raise ValueError(f"Task {self.task} does not train, so it has no worker id.")
        return self.task_index + (1 if "chief" in self.jobs else 0)

    @property
    def is_chief(self) -> bool:
        """True for the chief task, or worker 0 when the cluster has no chief."""
        if "chief" in self.jobs:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0


def _load_json(text: str) -> dict:
    """TF_CONFIG's JSON object."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"TF_CONFIG is not valid JSON ({err.msg} at line {err.lineno} column "
            f"{err.colno}). Received: TF_CONFIG={text!r}. Expected e.g. "
            '{"cluster": {"worker": ["localhost:2222", "localhost:2223"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object. Received: TF_CONFIG={text!r}.")
    return data


def _parse_jobs(cluster: object) -> dict[str, tuple[str, ...]]:
    """TF_CONFIG's ``cluster``: job name -> addresses, at most one chief and one evaluator."""
    if not isinstance(cluster, dict):
        raise ConfigError(
            f"TF_CONFIG 'cluster' must map job names to address lists. Received: {cluster!r}."
        )
    jobs: dict[str, tuple[str, ...]] = {}
    for job, tasks in cluster.items():
        if job not in JOB_TYPES:
            raise ConfigError(
                f"TF_CONFIG names an unknown job type {job!r}.{did_you_mean(job, JOB_TYPES)} "
                f"Valid job types: {', '.join(JOB_TYPES)}."
            )
        if isinstance(tasks, dict):
            tasks = [tasks[k] for k in sorted(tasks, key=int)]
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise ConfigError(
                f"TF_CONFIG cluster[{job!r}] must be a list of 'host:port' strings. "
                f"Received: {tasks!r}."
            )
        jobs[job] = tuple(tasks)
    if len(jobs.get("chief", ())) > 1:
        raise ConfigError(
            f"TF_CONFIG lists {len(jobs['chief'])} chiefs; a cluster has at most one. "
            f"Received: chief={list(jobs['chief'])}. Make the others workers."
        )
    if len(jobs.get("evaluator", ())) > 1:
        raise ConfigError(
            f"TF_CONFIG lists {len(jobs['evaluator'])} evaluators; a cluster has at most one "
            f"(TensorFlow's rule). Received: evaluator={list(jobs['evaluator'])}. Keep one."
        )
    return jobs


def _parse_task(task: Mapping, jobs: Mapping[str, tuple[str, ...]]) -> Task:
    """TF_CONFIG's ``task``: a job of the cluster and an index within it."""
    task_type, task_index = task.get("type"), task.get("index", 0)
    if task_type not in jobs:
        raise ConfigError(
            f"TF_CONFIG task type {task_type!r} is not a job of the cluster "
            f"({', '.join(jobs)}). Set task.type to one of them."
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ConfigError(
            f"TF_CONFIG task index must be an integer. Received: index={task_index!r}."
        )
    if not 0 <= task_index < len(jobs[task_type]):
        raise ConfigError(
            f"TF_CONFIG task index {task_index} is out of range for job {task_type!r} "
            f"with {len(jobs[task_type])} task(s) (valid: 0..{len(jobs[task_type]) - 1})."
        )
    return Task(task_type, task_index)


def parse_tf_config(text: str | None) -> ClusterInfo | None:
    """Parses and validates a ``TF_CONFIG`` value.

    Args:
        text: the JSON text, or ``None``/empty when TF_CONFIG is unset.

    Returns:
        The cluster, or ``None`` when TF_CONFIG is unset or names no cluster.

    Raises:
        ConfigError: naming TF_CONFIG, what was received and how to fix it.
    """
    if text is None or not text.strip():
        return None
    data = _load_json(text)
    cluster = data.get("cluster") or {}
    if not cluster:
        return None
    jobs = _parse_jobs(cluster)
    task = _parse_task(data.get("task") or {}, jobs)
    return ClusterInfo(jobs=jobs, task_type=task.type, task_index=task.index)


def tf_config_json(cluster: ClusterInfo) -> str:
    """The ``TF_CONFIG`` value that describes ``cluster`` and this task."""
    return json.dumps(tf_config(cluster.jobs, cluster.task))


def cluster_from_slurm(port_base: int = 8888) -> ClusterInfo | None:
    """Resolves a Slurm job step with TensorFlow's own ``SlurmClusterResolver``.

    Every task of the step becomes a worker, at ``<host>:<port_base + i>``
    for the i-th task on a host.

    Returns:
        The cluster, or ``None`` outside a Slurm step with several tasks.

    Raises:
        ConfigError: when the Slurm environment cannot be resolved.
    """
    if "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) < 2:
        return None
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpus = len([d for d in visible.split(",") if d.strip()])
    # Without GPUs the resolver divides the node's 0 GPUs among its tasks and
    # fails (range step 0); one placeholder slot per task, with nothing set
    # in CUDA_VISIBLE_DEVICES, gives every task its port.
    slots = {"gpus_per_node": gpus} if gpus else {
        "gpus_per_node": int(os.environ["SLURM_STEP_NUM_TASKS"]), "gpus_per_task": 1}
    try:
        resolver = slurm_cluster_resolver.SlurmClusterResolver(
            port_base=port_base, auto_set_gpu=gpus > 0, **slots
        )
        spec = resolver.cluster_spec().as_dict()
    except (RuntimeError, KeyError, ValueError) as err:
        raise ConfigError(
            f"Cannot resolve the Slurm job step into a cluster ({err}). Run inside `srun` "
            "with SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST and "
            "SLURM_STEP_TASKS_PER_NODE set, or set TF_CONFIG yourself."
        ) from None
    task_type, task_index = resolver.get_task_info()
    return parse_tf_config(json.dumps(tf_config(spec, Task(task_type, task_index))))


def cluster_from_env(environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """Reads the cluster from ``TF_CONFIG``, or else from a Slurm job step.

    A cluster resolved from Slurm is exported as ``TF_CONFIG`` so that
    TensorFlow's strategies see the same cluster.

    Args:
        environ: where to read ``TF_CONFIG`` (default: os.environ); Slurm is
            read from os.environ.
    """
    environ = os.environ if environ is None else environ
    if environ.get("TF_CONFIG", "").strip():
        return parse_tf_config(environ["TF_CONFIG"])
    cluster = cluster_from_slurm()
    if cluster is not None:
        os.environ["TF_CONFIG"] = tf_config_json(cluster)
    return cluster

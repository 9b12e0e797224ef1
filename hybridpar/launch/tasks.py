"""What a local cluster is made of, and what each task's exit means (pure Python).

The launcher's decisions live here, apart from the processes: the task
layout, each task's environment (its ``TF_CONFIG``), which exit ends the
cluster or restarts a task, and the lines that report it.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from hybridpar.config import did_you_mean
from hybridpar.exit_codes import PREEMPTED_EXIT_CODE, describe_status
from hybridpar.logs import LOG_TAGS_ENV
from hybridpar.topology.cluster import Task, tf_config

DEFAULT_GRACE = 5.0
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
EVALUATOR = Task("evaluator", 0)
LAUNCH_EXAMPLE = "hybridpar launch --workers 2 -- python train.py"


class UsageError(ValueError):
    """Bad command-line input; the message says what was received and how to fix it."""


def task_layout(num_workers: int, num_ps: int = 0, evaluator: bool = False) -> list[Task]:
    """The tasks of a local cluster.

    Without ps tasks: ``worker:0..N-1`` (worker 0 is the chief by TF's convention).
    With ``num_ps > 0`` (parameter-server mode): ``chief:0``, ``worker:0..N-1``,
    ``ps:0..M-1``. With ``evaluator``, ``evaluator:0`` last (sidecar evaluation:
    it trains nothing and runs no server).
    """
    check_counts(num_workers, num_ps)
    chief = [Task("chief", 0)] if num_ps else []
    workers = [Task("worker", i) for i in range(num_workers)]
    return chief + workers + [Task("ps", i) for i in range(num_ps)] + (
        [EVALUATOR] if evaluator else [])


def is_ps_mode(tasks: Iterable[Task]) -> bool:
    """True when the layout has parameter-server tasks."""
    return any(task.type == "ps" for task in tasks)


def has_evaluator(tasks: Iterable[Task]) -> bool:
    """True when the layout has an evaluator task."""
    return any(task.type == "evaluator" for task in tasks)

def make_tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> dict:
    """The TF_CONFIG dict of one task.

    Raises:
        UsageError: for an unknown task type, a type the cluster lacks, or an index
            out of range.
    """
    if task_type not in TASK_TYPES:
        raise UsageError(
            f"unknown task type {task_type!r}.{did_you_mean(task_type, TASK_TYPES)} "
            f"Valid types: {', '.join(TASK_TYPES)}. Received: --type {task_type}."
        )
    tasks = cluster.get(task_type) or []
    if not tasks:
        flag = "--workers" if task_type == "worker" else f"--{task_type}"
        raise UsageError(
            f"the cluster has no {task_type!r} tasks, so --type {task_type} is not possible. "
            f"Jobs in the cluster: {', '.join(job for job in cluster if cluster[job])}. "
            f"Pass {flag} or choose another --type."
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
        raise UsageError(
            f"--index {index} is out of range for job {task_type!r} with {len(tasks)} "
            f"task(s); valid: 0..{len(tasks) - 1}. Received: --type {task_type} --index {index}."
        )
    return tf_config(cluster, Task(task_type, index))


def task_environment(
    base: Mapping[str, str],
    cluster: Mapping[str, Sequence[str]],
    task: Task,
    restart: int = 0,
) -> dict[str, str]:
    """A child's environment: ``base`` plus TF_CONFIG, HYBRIDPAR_TASK/RESTART, unbuffered.

    ``HYBRIDPAR_LOG_TAGS=1`` makes hybridpar's log lines carry their level, so
    the launcher's console can keep other tasks' warnings and drop their INFO.
    """
    return {
        **base,
        "TF_CONFIG": json.dumps(make_tf_config(cluster, task.type, task.index)),
        "HYBRIDPAR_TASK": str(task),
        "HYBRIDPAR_RESTART": str(restart),
        "PYTHONUNBUFFERED": "1",
        LOG_TAGS_ENV: "1",
    }


def ends_cluster(task: Task, status: int, ps_mode: bool, evaluator_running: bool = False) -> bool:
    """True when this task's exit ends the cluster: a training task's failure, or the
    chief in ps mode (once no evaluator is running). An evaluator's exit never does:
    a failed evaluator is reported and training goes on."""
    if task.type == "evaluator":
        return False
    return status != 0 or (ps_mode and task.type == "chief" and not evaluator_running)


PsExitAction = Literal["end", "restart_task", "keep_going"]


def ps_mode_exit(
    task: Task,
    status: int,
    workers_alive: int,
    restarts_left: int,
    *,
    evaluator_running: bool = False,
    chief_done: bool = False,
) -> PsExitAction:
    """What one task's exit means in parameter-server mode.

    The chief's failure ends the cluster; its success too, unless the
    evaluator is still running: the cluster is done when the chief and the
    evaluator are. The evaluator's exit ends the cluster once the chief is
    done (``chief_done``), else training goes on. A failed worker is
    restarted alone (same address) while restarts are left, and the
    coordinator takes it back; without restarts the other workers go on,
    unless none is left. A ps task's exit leaves the chief to report which ps
    was lost and end the cluster.
    """
    if chief_done or task.type == "evaluator":  # after the chief, only the evaluator counts
        return "end" if chief_done and task.type == "evaluator" else "keep_going"
    if task.type == "chief":
        return "keep_going" if status == 0 and evaluator_running else "end"
    if task.type == "worker" and status != 0:
        if restarts_left > 0:
            return "restart_task"
        return "keep_going" if workers_alive > 0 else "end"
    return "keep_going"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one run of the cluster ended.

    Attributes:
        reason: ``finished`` (success), ``failed`` (a task exited non-zero),
            ``timeout`` or ``signal`` (the launcher was interrupted).
        exit_code: the launcher's exit code for this outcome.
        task: the task that ended the cluster (finished/failed); when the
            cluster finished, the last training task to exit.
        signum: the signal the launcher received (signal).
        evaluator_status: how the evaluator exited, when the cluster finished
            with one (its failure does not change ``exit_code``).
    """

    reason: Literal["finished", "failed", "timeout", "signal"]
    exit_code: int
    task: Task | None = None
    signum: int | None = None
    evaluator_status: int | None = None


def summary_line(outcome: Outcome, num_tasks: int, ps_mode: bool, timeout: float | None) -> str:
    """The final ``hybridpar launch:`` line: which task ended the cluster and why.

    ``num_tasks`` counts the training tasks (the evaluator aside).
    """
    code = f"exit code {outcome.exit_code}"
    evaluator = ("" if outcome.evaluator_status is None else
                 f"; {EVALUATOR} exited with {describe_status(outcome.evaluator_status)}")
    if outcome.reason == "finished" and ps_mode:
        return (f"task {outcome.task} exited with 0{evaluator}; stopped the worker and ps "
                f"tasks; {code}")
    if outcome.reason == "finished":
        kind = "task(s)" if outcome.evaluator_status is None else "training task(s)"
        return (f"all {num_tasks} {kind} exited with 0 (the last was {outcome.task})"
                f"{evaluator}; {code}")
    if outcome.reason == "failed":
        status = describe_status(outcome.exit_code)
        return f"task {outcome.task} exited with {status}; stopped the other tasks; {code}"
    if outcome.reason == "timeout":
        return (
            f"timed out: the cluster did not finish within --timeout {timeout:g} seconds; "
            f"stopped all tasks; {code}"
        )
    name = signal.Signals(outcome.signum).name if outcome.signum else "a signal"
    return f"received {name}; stopped all tasks; {code}"


def evaluator_exit_line(status: int, training_done: bool) -> str | None:
    """The line for a failed evaluator (``None`` when it exited with 0)."""
    if status == 0:
        return None
    after = "after training ended" if training_done else "while training goes on without it"
    return (f"task {EVALUATOR} exited with {describe_status(status)} {after} (see its output "
            "above; the evaluator is not restarted)")


def task_restart_line(task: Task, status: int, restart: int, max_restarts: int) -> str:
    """``task worker:1 exited with 137; restarting it alone (restart 1 of 2)``."""
    return (
        f"task {task} exited with {describe_status(status)}; restarting it alone at the same "
        f"address (restart {restart} of {max_restarts})"
    )


def restart_line(task: Task, status: int, restart: int, max_restarts: int) -> str:
    """``task worker:1 exited with 137; restarting the cluster (restart 1 of 2)``."""
    shown = describe_status(status) if status == PREEMPTED_EXIT_CODE else str(status)
    return (
        f"task {task} exited with {shown}; restarting the cluster "
        f"(restart {restart} of {max_restarts})"
    )


def check_counts(num_workers: int, num_ps: int = 0) -> None:
    """Raises UsageError unless ``num_workers >= 1`` and ``num_ps >= 0``."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise UsageError(
            f"--workers must be at least 1. Received: --workers {num_workers}. "
            f"Use e.g. {LAUNCH_EXAMPLE}."
        )
    if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
        raise UsageError(
            f"--ps must be 0 or more. Received: --ps {num_ps}. Omit --ps for a worker-only "
            f"cluster, or pass --ps 1 or more for parameter-server mode."
        )

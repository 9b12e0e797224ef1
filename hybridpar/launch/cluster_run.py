"""One run of a cluster and the restart loop around it, whatever engine starts the tasks.

``ClusterRun`` applies the policies of ``launch.tasks`` (which exit ends the
cluster, which restarts a task alone) to tasks an engine starts:
``processes.LocalCluster`` runs them as local child processes,
``ray_engine.RayCluster`` as child processes of Ray actors. ``run_cluster``
starts runs until one ends the cluster, within ``--max-restarts`` and
``--timeout``, and prints the summary line.
"""

from __future__ import annotations

import abc
import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hybridpar.exit_codes import TIMEOUT_EXIT_CODE
from hybridpar.launch.output import Console, TaskOutput, log_file, shown_task
from hybridpar.launch.signals import SignalWatcher
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    Outcome,
    ends_cluster,
    is_ps_mode,
    ps_mode_exit,
    restart_line,
    summary_line,
    task_restart_line,
)
from hybridpar.topology.cluster import Task, cluster_spec

POLL_SECONDS = 0.05


class TaskStartError(Exception):
    """A task's command could not be started (not found, not executable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class Outputs:
    """Where the tasks' output goes: the console, and a log file per task.

    Attributes:
        console: the launcher's stdout/stderr.
        log_dir: one ``<type>-<index>.log`` per task, appended at every start
            (``None``: no files).
        console_mode: ``chief`` (the chief whole, others' warnings and errors)
            or ``all`` (every task whole).
    """

    console: Console
    log_dir: Path | None = None
    console_mode: str = "chief"

    def open(self, task: Task, tasks: Sequence[Task], restart: int) -> TaskOutput:
        """A fresh ``TaskOutput`` for one start of ``task``."""
        whole = self.console_mode == "all" or task == shown_task(tasks)
        return TaskOutput(task, self.console, log_file(self.log_dir, task), whole, restart)


class ClusterRun(abc.ABC):
    """One run of a cluster: every task runs ``command`` with its own TF_CONFIG.

    Engines implement ``_spawn`` (start one task), ``_returncode`` (``None``
    while it runs) and ``stop``.
    """

    def __init__(
        self,
        command: Sequence[str],
        tasks: Sequence[Task],
        addresses: Sequence[str],
        *,
        restart: int = 0,
        outputs: Outputs | None = None,
        task_restarts: int = 0,
        max_restarts: int = 0,
    ) -> None:
        self.command = list(command)
        self.tasks = list(tasks)
        self.addresses = list(addresses)
        self.cluster = cluster_spec(self.tasks, addresses)
        self.restart = restart
        self.task_restarts = task_restarts
        self.max_restarts = max_restarts
        self.ps_mode = is_ps_mode(self.tasks)
        self.outputs = outputs or Outputs(Console())
        self.task_outputs: list[TaskOutput | None] = [None] * len(self.tasks)
        self._status: dict[int, int] = {}

    @abc.abstractmethod
    def _spawn(self, i: int, restart: int, output: TaskOutput) -> None:
        """Starts task ``i``; raises TaskStartError when its command cannot start."""

    @abc.abstractmethod
    def _returncode(self, i: int) -> int | None:
        """Task ``i``'s exit status (shell style, 128+N for signal N), ``None`` while it runs."""

    @abc.abstractmethod
    def stop(self, grace: float = DEFAULT_GRACE, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stops every task (SIGTERM, SIGKILL after ``grace`` s) and closes their outputs."""

    def start(self) -> None:
        """Starts every task; if one cannot start, stops those started and re-raises."""
        try:
            for i in range(len(self.tasks)):
                self._start_task(i, self.restart)
        except TaskStartError:
            self.stop(grace=0)
            raise

    def _drain(self, i: int) -> None:  # noqa: B027 (optional hook)
        """Waits (briefly) until task ``i``'s last output arrived; engines override it."""

    def _start_task(self, i: int, restart: int) -> None:
        previous = self.task_outputs[i]
        if previous is not None:
            self._drain(i)
            previous.close()
        output = self.outputs.open(self.tasks[i], self.tasks, restart)
        self.task_outputs[i] = output
        self._spawn(i, restart, output)

    def close_outputs(self) -> None:
        for output in self.task_outputs:
            if output is not None:
                output.close()

    def _workers_alive(self) -> int:
        return sum(
            1
            for i, task in enumerate(self.tasks)
            if task.type == "worker" and i not in self._status
        )

    def _ps_mode_exit(self, i: int, status: int) -> Outcome | None:
        task = self.tasks[i]
        restarts_left = self.max_restarts - self.restart - self.task_restarts
        action = ps_mode_exit(task, status, self._workers_alive(), restarts_left)
        if action == "end":
            return Outcome("failed" if status else "finished", status, task)
        if action == "restart_task":
            self.task_restarts += 1
            restart = self.restart + self.task_restarts
            self.outputs.console.info(task_restart_line(task, status, restart, self.max_restarts))
            del self._status[i]
            self._start_task(i, restart)
        return None

    def poll(self) -> Outcome | None:
        """Reaps exited tasks; returns the outcome once one ends the cluster or all finished."""
        for i, task in enumerate(self.tasks):
            if i in self._status:
                continue
            status = self._returncode(i)
            if status is None:
                continue
            self._status[i] = status
            if self.ps_mode:
                outcome = self._ps_mode_exit(i, status)
                if outcome is not None:
                    return outcome
                continue
            if ends_cluster(task, status, self.ps_mode):
                return Outcome("failed" if status else "finished", status, task)
            if len(self._status) == len(self.tasks):
                return Outcome("finished", 0, task)
        return None

    def wait(
        self,
        deadline: float | None = None,
        interrupted: Callable[[], int | None] = lambda: None,
    ) -> Outcome:
        """Waits until a task ends the cluster, ``deadline`` (monotonic) passes or a signal."""
        while True:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            signum = interrupted()
            if signum:
                return Outcome("signal", 128 + signum, signum=signum)
            if deadline is not None and time.monotonic() >= deadline:
                return Outcome("timeout", TIMEOUT_EXIT_CODE)
            time.sleep(POLL_SECONDS)

    def report_failure(self, task: Task) -> None:
        """Prints the last lines of a failed task the console did not show whole."""
        output = self.task_outputs[self.tasks.index(task)]
        if output is None or output.whole or not output.tail:
            return
        where = f" (full log: {output.log_path})" if output.log_path else ""
        console = self.outputs.console
        console.info(f"last {len(output.tail)} line(s) of {task}{where}:")
        for line in output.tail:
            console.write(console.stderr, f"[{task}] {line}")


def describe_run(run: ClusterRun, max_restarts: int) -> str:
    """``starting 2 task(s) (worker-only): worker:0=h:p ...; command: ...``."""
    layout = " ".join(f"{t}={a}" for t, a in zip(run.tasks, run.addresses, strict=True))
    runs = f"run {run.restart + 1} of at most {max_restarts + 1}; " if max_restarts else ""
    mode = "parameter-server mode" if run.ps_mode else "worker-only"
    return f"starting {len(run.tasks)} task(s) ({runs}{mode}): {layout}; " \
        f"command: {shlex.join(run.command)}"


def run_cluster(
    new_run: Callable[[int], ClusterRun],
    *,
    max_restarts: int,
    timeout: float | None,
    grace: float,
    outputs: Outputs,
    signals: SignalWatcher,
) -> int:
    """Starts ``new_run(restart)`` runs until one ends the cluster; returns the exit code.

    ``timeout`` counts from the first start, restarts included. A signal
    ``signals`` records stops the run; a second one skips the grace period.
    """
    console = outputs.console
    deadline = None if timeout is None else time.monotonic() + timeout
    if outputs.log_dir is not None:
        outputs.console.info(f"every task's full log is in {outputs.log_dir}/ "
                             "(<type>-<index>.log)")
    restart = 0
    while True:
        run = new_run(restart)
        console.info(describe_run(run, max_restarts))
        try:
            try:
                run.start()
            except TaskStartError as err:
                console.info(str(err))
                return err.exit_code
            outcome = run.wait(deadline, signals.first)
        finally:
            run.stop(grace, hurry=signals.repeated)
        failed_task = outcome.task if outcome.reason == "failed" else None
        if failed_task is not None:
            run.report_failure(failed_task)
        time_left = deadline is None or time.monotonic() < deadline
        restart += run.task_restarts
        if failed_task and restart < max_restarts and time_left and not signals.first():
            restart += 1
            console.info(restart_line(failed_task, outcome.exit_code, restart, max_restarts))
            continue
        if signals.first() and outcome.reason != "signal":
            outcome = Outcome("signal", 128 + signals.received[0], signum=signals.received[0])
        console.info(summary_line(outcome, len(run.tasks), run.ps_mode, timeout))
        return outcome.exit_code

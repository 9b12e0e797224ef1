"""The local engine: runs a command as a cluster of processes on this machine, restarting it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from hybridpar.launch.cluster_run import Outputs, run_cluster
from hybridpar.launch.options import LaunchOptions
from hybridpar.launch.output import Console
from hybridpar.launch.ports import DEFAULT_HOST, format_address, pick_ports
from hybridpar.launch.processes import LocalCluster
from hybridpar.launch.signals import SignalWatcher
from hybridpar.launch.tasks import DEFAULT_GRACE


def launch(
    command: Sequence[str],
    num_workers: int,
    num_ps: int = 0,
    *,
    evaluator: bool = False,
    max_restarts: int = 0,
    timeout: float | None = None,
    host: str = DEFAULT_HOST,
    grace: float = DEFAULT_GRACE,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    log_dir: str | Path | None = None,
    console: str = "chief",
) -> int:
    """Runs ``command`` as a local cluster and returns the exit code (see ``hybridpar.launch``).

    With ``evaluator``, one ``evaluator`` task runs ``command`` too (see
    ``tasks.task_layout``). ``timeout`` counts from the first start, restarts
    included. A second signal
    during the graceful stop skips straight to SIGKILL. ``log_dir`` gets one
    full log per task (``None``: none); ``console`` is ``chief`` (the chief's
    output whole, the other tasks' warnings and errors) or ``all``.

    Raises:
        UsageError: for anything ``LaunchOptions`` refuses (an empty command,
            counts or durations out of range, an unknown console mode).
    """
    options = LaunchOptions(
        list(command), num_workers, num_ps, max_restarts, timeout, host, grace,
        log_dir=None if log_dir is None else str(log_dir), console=console, evaluator=evaluator,
    )
    return run(options, env=env, console=Console(stdout, stderr))


def run(
    options: LaunchOptions,
    *,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
) -> int:
    """Runs ``options.command`` as processes on this machine; returns the exit code.

    ``env`` is the tasks' base environment (``None``: this process's).
    """
    tasks = options.tasks
    outputs = Outputs(console or Console(),
                      None if options.log_dir is None else Path(options.log_dir),
                      options.console)
    previous_ports: list[int] = []

    def new_run(restart: int) -> LocalCluster:
        ports = pick_ports(len(tasks), exclude=previous_ports)
        previous_ports[:] = ports
        addresses = [format_address(options.host, port) for port in ports]
        return LocalCluster(options.command, tasks, addresses, restart=restart, env=env,
                            outputs=outputs, max_restarts=options.max_restarts)

    with SignalWatcher() as signals:
        return run_cluster(new_run, max_restarts=options.max_restarts, timeout=options.timeout,
                           grace=options.grace, outputs=outputs, signals=signals)

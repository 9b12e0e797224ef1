"""``hybridpar launch`` (the local engine): runs a command as a local cluster, restarting it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from hybridpar.launch.cluster_run import Outputs, run_cluster
from hybridpar.launch.output import Console
from hybridpar.launch.ports import DEFAULT_HOST, format_address, pick_ports
from hybridpar.launch.processes import LocalCluster
from hybridpar.launch.signals import SignalWatcher
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    LAUNCH_EXAMPLE,
    UsageError,
    check_launch_options,
    task_layout,
)


def check_command(command: Sequence[str]) -> None:
    """Raises UsageError for an empty command."""
    if not command:
        raise UsageError(f"no command to run. Put it after `--`, e.g. {LAUNCH_EXAMPLE}.")


def launch(
    command: Sequence[str],
    num_workers: int,
    num_ps: int = 0,
    *,
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

    ``timeout`` counts from the first start, restarts included. A second signal
    during the graceful stop skips straight to SIGKILL. ``log_dir`` gets one
    full log per task (``None``: none); ``console`` is ``chief`` (the chief's
    output whole, the other tasks' warnings and errors) or ``all``.

    Raises:
        UsageError: for an empty command or counts/durations out of range.
    """
    check_command(command)
    check_launch_options(num_workers, num_ps, max_restarts, timeout, grace)
    tasks = task_layout(num_workers, num_ps)
    outputs = Outputs(Console(stdout, stderr), None if log_dir is None else Path(log_dir), console)
    previous_ports: list[int] = []

    def new_run(restart: int) -> LocalCluster:
        ports = pick_ports(len(tasks), exclude=previous_ports)
        previous_ports[:] = ports
        addresses = [format_address(host, port) for port in ports]
        return LocalCluster(command, tasks, addresses, restart=restart, env=env,
                            outputs=outputs, max_restarts=max_restarts)

    with SignalWatcher() as signals:
        return run_cluster(new_run, max_restarts=max_restarts, timeout=timeout, grace=grace,
                           outputs=outputs, signals=signals)

"""``hybridpar launch``: runs a command as a local cluster, restarting it on failure."""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from typing import IO

from hybridpar.launch.ports import DEFAULT_HOST, format_address, pick_ports
from hybridpar.launch.processes import LocalCluster, Output, SignalWatcher
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    LAUNCH_EXAMPLE,
    Outcome,
    UsageError,
    check_launch_options,
    restart_line,
    summary_line,
    task_layout,
)


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
) -> int:
    """Runs ``command`` as a local cluster and returns the exit code (see the module doc).

    With ``evaluator``, one ``evaluator`` task runs ``command`` too. ``timeout``
    counts from the first start, restarts included. A second signal
    during the graceful stop skips straight to SIGKILL.

    Raises:
        UsageError: for an empty command or counts/durations out of range.
    """
    if not command:
        raise UsageError(f"no command to run. Put it after `--`, e.g. {LAUNCH_EXAMPLE}.")
    check_launch_options(num_workers, num_ps, max_restarts, timeout, grace)
    tasks = task_layout(num_workers, num_ps, evaluator)
    trainers = sum(task.type != "evaluator" for task in tasks)
    output = Output(stdout, stderr)
    deadline = None if timeout is None else time.monotonic() + timeout
    previous_ports: list[int] = []
    with SignalWatcher() as signals:
        restart = 0
        while restart <= max_restarts:
            ports = pick_ports(len(tasks), exclude=previous_ports)
            previous_ports = ports
            addresses = [format_address(host, port) for port in ports]
            cluster = LocalCluster(
                command, tasks, addresses, restart=restart, env=env, output=output,
                max_restarts=max_restarts,
            )
            layout = " ".join(f"{t}={a}" for t, a in zip(tasks, addresses, strict=True))
            run = f"run {restart + 1} of at most {max_restarts + 1}; " if max_restarts else ""
            output.info(
                f"starting {len(tasks)} task(s) ({run}"
                f"{'parameter-server mode' if cluster.ps_mode else 'worker-only'}): {layout}; "
                f"command: {shlex.join(command)}"
            )
            try:
                try:
                    cluster.start()
                except OSError as err:
                    output.info(
                        f"cannot start {shlex.join(command)}: {err}. Check that {command[0]!r} "
                        f"is on PATH (or give its path) and is executable."
                    )
                    return 126 if isinstance(err, PermissionError) else 127
                outcome = cluster.wait(deadline, signals.first)
            finally:
                cluster.stop(grace, hurry=signals.repeated)
            failed_task = outcome.task if outcome.reason == "failed" else None
            time_left = deadline is None or time.monotonic() < deadline
            restart += cluster.task_restarts
            if failed_task and restart < max_restarts and time_left and not signals.first():
                restart += 1
                output.info(restart_line(failed_task, outcome.exit_code, restart, max_restarts))
                continue
            if signals.first() and outcome.reason != "signal":
                outcome = Outcome("signal", 128 + signals.received[0], signum=signals.received[0])
            output.info(summary_line(outcome, trainers, cluster.ps_mode, timeout))
            return outcome.exit_code
    raise AssertionError("unreachable")  # pragma: no cover



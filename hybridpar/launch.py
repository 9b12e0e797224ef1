"""A real local multi-process TensorFlow cluster: ``hybridpar launch`` and ``hybridpar tf-config``.

``hybridpar launch --workers N [--ps M] [--max-restarts K] [--timeout S] -- CMD [ARGS...]``
picks free localhost ports, starts one process per task running CMD with its own
``TF_CONFIG``, re-prints every output line prefixed with the task (``[worker:1] ...``),
stops the whole cluster when a task fails (SIGTERM to each task's process group,
SIGKILL after a grace period) and can start it again on new ports.

In parameter-server mode (``--ps M``) the chief's exit ends the cluster; a failed
worker is restarted alone at its address (the coordinator takes it back) while
restarts are left, else the other workers go on; a lost ps task is left to the
chief to report. ``--max-restarts`` counts both kinds of restart.

``hybridpar tf-config --workers h1:p,h2:p [--chief h:p] [--ps h:p,...] --type T --index I``
prints the ``TF_CONFIG`` JSON to set on each machine of a real cluster.

Exit codes of ``launch``: 0 when every task (in parameter-server mode: the chief)
exited 0; else the code of the first task that failed (128+signum for a task killed
by a signal, 42 for a task preempted by SIGTERM after saving a checkpoint); 124 on
``--timeout``; 128+signum when the launcher itself got SIGINT (130), SIGTERM (143) or
SIGHUP (129); 127/126 when CMD cannot be started; 2 for bad command-line input. No
TensorFlow here: this module is plain Python.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Literal, NamedTuple, NoReturn

from hybridpar.config import did_you_mean

DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRACE = 5.0
TIMEOUT_EXIT_CODE = 124
PREEMPTED_EXIT_CODE = 42  # a task saved a checkpoint on SIGTERM (hybridpar.preemption)
USAGE_EXIT_CODE = 2
TASK_TYPES = ("chief", "worker", "ps")
_POLL_SECONDS = 0.05
_LAUNCH_EXAMPLE = "hybridpar launch --workers 2 -- python train.py"


class UsageError(ValueError):
    """Bad command-line input; the message says what was received and how to fix it."""


# --------------------------------------------------------------------------- pure logic


class Task(NamedTuple):
    """One task of a cluster, e.g. ``Task("worker", 1)`` printed as ``worker:1``."""

    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


def task_layout(num_workers: int, num_ps: int = 0) -> list[Task]:
    """The tasks of a local cluster.

    Without ps tasks: ``worker:0..N-1`` (worker 0 is the chief by TF's convention).
    With ``num_ps > 0`` (parameter-server mode): ``chief:0``, ``worker:0..N-1``,
    ``ps:0..M-1``.
    """
    check_counts(num_workers, num_ps)
    chief = [Task("chief", 0)] if num_ps else []
    workers = [Task("worker", i) for i in range(num_workers)]
    return chief + workers + [Task("ps", i) for i in range(num_ps)]


def is_ps_mode(tasks: Iterable[Task]) -> bool:
    """True when the layout has parameter-server tasks."""
    return any(task.type == "ps" for task in tasks)


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets (``[::1]:2222``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cluster_spec(tasks: Sequence[Task], addresses: Sequence[str]) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: job name -> addresses, in task-index order."""
    if len(tasks) != len(addresses):
        raise ValueError(f"{len(tasks)} tasks but {len(addresses)} addresses.")
    spec: dict[str, list[str]] = {}
    for task, address in sorted(zip(tasks, addresses, strict=True), key=lambda p: p[0].index):
        spec.setdefault(task.type, []).append(address)
    order = {name: i for i, name in enumerate(TASK_TYPES)}
    return {job: spec[job] for job in sorted(spec, key=lambda j: order.get(j, len(order)))}


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
    return {
        "cluster": {job: list(addrs) for job, addrs in cluster.items() if addrs},
        "task": {"type": task_type, "index": index},
    }


def parse_address(text: str, flag: str = "address") -> str:
    """Validates one ``host:port`` (IPv6 as ``[::1]:2222``) and returns it stripped.

    Raises:
        UsageError: for a missing host or port, or a port outside 1..65535.
    """
    item = text.strip()
    hint = f"Expected host:port with a port in 1..65535, e.g. 10.0.0.1:2222. Received: {flag} "
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        ok = sep and rest.startswith(":")
        port_text = rest[1:] if ok else ""
    else:
        host, sep, port_text = item.rpartition(":")
        ok = sep and ":" not in host
    if not ok or not host:
        raise UsageError(f"{text!r} is not host:port. {hint}{text!r}.")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(f"{text!r} has an invalid port {port_text!r}. {hint}{text!r}.")
    return item


def parse_address_list(text: str, flag: str) -> list[str]:
    """Parses a comma-separated ``host:port`` list given to ``flag``.

    Raises:
        UsageError: for an empty list or item, or a malformed address.
    """
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise UsageError(
            f"{flag} expects a comma-separated list of host:port without empty items, "
            f"e.g. {flag} 10.0.0.1:2222,10.0.0.2:2222. Received: {flag} {text!r}."
        )
    return [parse_address(item, flag) for item in items]


def check_unique_addresses(cluster: Mapping[str, Sequence[str]]) -> None:
    """Raises UsageError when two tasks share one ``host:port``."""
    seen: dict[str, str] = {}
    for job, addresses in cluster.items():
        for index, address in enumerate(addresses):
            if address in seen:
                raise UsageError(
                    f"{address} is given to both {seen[address]} and {job}:{index}; every task "
                    f"needs its own host:port."
                )
            seen[address] = f"{job}:{index}"


def task_environment(
    base: Mapping[str, str],
    cluster: Mapping[str, Sequence[str]],
    task: Task,
    restart: int = 0,
) -> dict[str, str]:
    """A child's environment: ``base`` plus TF_CONFIG, HYBRIDPAR_TASK/RESTART, unbuffered."""
    tf_config = make_tf_config(cluster, task.type, task.index)
    return {
        **base,
        "TF_CONFIG": json.dumps(tf_config),
        "HYBRIDPAR_TASK": str(task),
        "HYBRIDPAR_RESTART": str(restart),
        "PYTHONUNBUFFERED": "1",
    }


def exit_status(returncode: int) -> int:
    """A shell-style exit status: a task killed by signal N (``returncode == -N``) -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_status(status: int) -> str:
    """``"137 (killed by SIGKILL)"`` for statuses above 128 that name a signal, else ``"3"``.

    ``PREEMPTED_EXIT_CODE`` reads ``"42 (preempted, saved a checkpoint)"``.
    """
    if status == PREEMPTED_EXIT_CODE:
        return f"{status} (preempted, saved a checkpoint)"
    if status > 128:
        try:
            return f"{status} (killed by {signal.Signals(status - 128).name})"
        except ValueError:
            pass
    return str(status)


def ends_cluster(task: Task, status: int, ps_mode: bool) -> bool:
    """True when this task's exit ends the cluster: any failure, or the chief in ps mode."""
    return status != 0 or (ps_mode and task.type == "chief")


PsExitAction = Literal["end", "restart_task", "keep_going"]


def ps_mode_exit(task: Task, status: int, workers_alive: int, restarts_left: int) -> PsExitAction:
    """What one task's exit means in parameter-server mode.

    The chief's exit ends the cluster. A failed worker is restarted alone
    (same address) while restarts are left, and the coordinator takes it
    back; without restarts the other workers go on, unless none is left. A
    ps task's exit leaves the chief to report which ps was lost and end the
    cluster.
    """
    if task.type == "chief":
        return "end"
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
        task: the task that ended the cluster (finished/failed).
        signum: the signal the launcher received (signal).
    """

    reason: Literal["finished", "failed", "timeout", "signal"]
    exit_code: int
    task: Task | None = None
    signum: int | None = None


def summary_line(outcome: Outcome, num_tasks: int, ps_mode: bool, timeout: float | None) -> str:
    """The final ``hybridpar launch:`` line: which task ended the cluster and why."""
    code = f"exit code {outcome.exit_code}"
    if outcome.reason == "finished" and ps_mode:
        return f"task {outcome.task} exited with 0; stopped the worker and ps tasks; {code}"
    if outcome.reason == "finished":
        return f"all {num_tasks} task(s) exited with 0 (the last was {outcome.task}); {code}"
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
            f"Use e.g. {_LAUNCH_EXAMPLE}."
        )
    if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
        raise UsageError(
            f"--ps must be 0 or more. Received: --ps {num_ps}. Omit --ps for a worker-only "
            f"cluster, or pass --ps 1 or more for parameter-server mode."
        )


def check_launch_options(
    num_workers: int,
    num_ps: int,
    max_restarts: int,
    timeout: float | None,
    grace: float = DEFAULT_GRACE,
) -> None:
    """Raises UsageError for counts or durations ``launch`` cannot use."""
    check_counts(num_workers, num_ps)
    if max_restarts < 0:
        raise UsageError(
            f"--max-restarts must be 0 or more. Received: --max-restarts {max_restarts}. "
            f"Use 0 (the default) to never restart."
        )
    if timeout is not None and not timeout > 0:
        raise UsageError(
            f"--timeout must be a positive number of seconds. Received: --timeout {timeout:g}. "
            f"Omit --timeout to wait without a limit."
        )
    if not grace >= 0:
        raise UsageError(f"--grace must be 0 or more seconds. Received: --grace {grace:g}.")


def _bind_free_port() -> int:
    """A port the OS reports free on TCP (used when portpicker is not installed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def pick_ports(
    count: int,
    exclude: Iterable[int] = (),
    pick: Callable[[], int] | None = None,
) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``.

    ``pick`` defaults to ``portpicker.pick_unused_port`` (the ``test`` extra), else
    a port bound with port 0 and released.
    """
    if pick is None:
        try:
            import portpicker
        except ImportError:
            pick = _bind_free_port
        else:
            pick = portpicker.pick_unused_port
    excluded = set(exclude)
    ports: list[int] = []
    for _ in range(count * 50):
        if len(ports) == count:
            break
        port = pick()
        if port not in excluded and port not in ports:
            ports.append(port)
    if len(ports) != count:
        raise RuntimeError(f"could not find {count} distinct free ports (found {ports}).")
    return ports


# --------------------------------------------------------------------------- processes


class _Output:
    """Writes whole lines to the launcher's stdout/stderr under one lock."""

    def __init__(self, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        self._lock = threading.Lock()

    def write(self, stream: IO[str], line: str) -> None:
        with self._lock:
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # closed or broken pipe: keep draining the child
                pass

    def info(self, text: str) -> None:
        self.write(self.stderr, f"hybridpar launch: {text}")


def _live_groups(pgids: Iterable[int]) -> set[int]:
    """The process groups among ``pgids`` that still have a live (non-zombie) member."""
    candidates = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        candidates.add(pgid)
    if not candidates or not os.path.isdir("/proc"):
        return candidates
    live = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) in candidates and fields[0] not in (b"Z", b"X"):
            live.add(int(fields[2]))
    return live


def _signal_groups(pgids: Iterable[int], signum: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)


class LocalCluster:
    """One run of a local cluster: every task runs ``command`` with its own TF_CONFIG.

    Each child starts in its own session (process group id == its pid), so
    ``stop`` reaches its whole process tree, grandchildren included, unless
    they start a session of their own.
    """

    def __init__(
        self,
        command: Sequence[str],
        tasks: Sequence[Task],
        addresses: Sequence[str],
        *,
        restart: int = 0,
        env: Mapping[str, str] | None = None,
        output: _Output | None = None,
        task_restarts: int = 0,
        max_restarts: int = 0,
    ) -> None:
        self.command = list(command)
        self.task_restarts = task_restarts
        self.max_restarts = max_restarts
        self.tasks = list(tasks)
        self.cluster = cluster_spec(self.tasks, addresses)
        self.restart = restart
        self.ps_mode = is_ps_mode(self.tasks)
        self._env = dict(os.environ if env is None else env)
        self._output = output or _Output()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._readers: list[threading.Thread] = []
        self._status: dict[int, int] = {}

    @property
    def pids(self) -> list[int]:
        """The pids (== process-group ids) of the started tasks."""
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        """Starts every task; on OSError (e.g. CMD not found) stops those started and re-raises."""
        try:
            for task in self.tasks:
                self._procs.append(self._spawn(task, self.restart))
        except OSError:
            self.stop(grace=0)
            raise

    def _spawn(self, task: Task, restart: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            self.command,
            env=task_environment(self._env, self.cluster, task, restart),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        streams = ((proc.stdout, self._output.stdout), (proc.stderr, self._output.stderr))
        for pipe, stream in streams:
            reader = threading.Thread(
                target=self._pump,
                args=(pipe, f"[{task}] ", stream),
                daemon=True,
                name=f"hybridpar-launch-{task}",
            )
            reader.start()
            self._readers.append(reader)
        return proc

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
            self._output.info(task_restart_line(task, status, restart, self.max_restarts))
            self._procs[i] = self._spawn(task, restart)
            del self._status[i]
        return None

    def _pump(self, pipe: IO[bytes], prefix: str, stream: IO[str]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")
                self._output.write(stream, prefix + line)

    def poll(self) -> Outcome | None:
        """Reaps exited tasks; returns the outcome once one ends the cluster or all finished."""
        for i, proc in enumerate(self._procs):
            if i in self._status:
                continue
            returncode = proc.poll()
            if returncode is None:
                continue
            status = self._status[i] = exit_status(returncode)
            task = self.tasks[i]
            if self.ps_mode:
                outcome = self._ps_mode_exit(i, status)
                if outcome is not None:
                    return outcome
                continue
            if ends_cluster(task, status, self.ps_mode):
                return Outcome("failed" if status else "finished", status, task)
            if len(self._status) == len(self._procs):
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
            time.sleep(_POLL_SECONDS)

    def stop(self, grace: float = DEFAULT_GRACE, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM to every task's process group, SIGKILL to those alive after ``grace`` s.

        Returns once no process of the groups is alive (zombies aside) and the
        output readers have drained. ``hurry()`` returning True skips the grace.
        """
        pgids = self.pids
        live = _live_groups(pgids)
        _signal_groups(live, signal.SIGTERM)
        end = time.monotonic() + grace
        while live and time.monotonic() < end and not hurry():
            time.sleep(_POLL_SECONDS)
            for proc in self._procs:
                proc.poll()
            live = _live_groups(pgids)
        if live:
            _signal_groups(live, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        end = time.monotonic() + 10
        while _live_groups(pgids) and time.monotonic() < end:
            time.sleep(_POLL_SECONDS)
        end = time.monotonic() + 2  # a process that left its group may hold a pipe open
        for reader in self._readers:
            reader.join(timeout=max(0.01, end - time.monotonic()))


class _SignalWatcher:
    """Records SIGINT/SIGTERM/SIGHUP while active (main thread only).

    SIGINT and SIGTERM are always handled, even when the caller ignored them (as a
    shell does for background jobs); an ignored SIGHUP (nohup) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalWatcher:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # under nohup: keep ignoring hangups
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)

    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def repeated(self) -> bool:
        return len(self.received) > 1


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
) -> int:
    """Runs ``command`` as a local cluster and returns the exit code (see the module doc).

    ``timeout`` counts from the first start, restarts included. A second signal
    during the graceful stop skips straight to SIGKILL.

    Raises:
        UsageError: for an empty command or counts/durations out of range.
    """
    if not command:
        raise UsageError(f"no command to run. Put it after `--`, e.g. {_LAUNCH_EXAMPLE}.")
    check_launch_options(num_workers, num_ps, max_restarts, timeout, grace)
    tasks = task_layout(num_workers, num_ps)
    output = _Output(stdout, stderr)
    deadline = None if timeout is None else time.monotonic() + timeout
    previous_ports: list[int] = []
    with _SignalWatcher() as signals:
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
            output.info(summary_line(outcome, len(tasks), cluster.ps_mode, timeout))
            return outcome.exit_code
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- command line


class _ParserExit(Exception):
    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of calling ``sys.exit``."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ParserExit(status, message)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Parsed ``hybridpar launch`` arguments."""

    command: list[str]
    workers: int
    ps: int = 0
    max_restarts: int = 0
    timeout: float | None = None
    host: str = DEFAULT_HOST
    grace: float = DEFAULT_GRACE


def _launch_parser() -> _Parser:
    parser = _Parser(
        prog="hybridpar launch",
        usage="hybridpar launch --workers N [--ps M] [--max-restarts K] [--timeout SECONDS] "
        "[--host HOST] [--grace SECONDS] -- CMD [ARGS...]",
        description="Start a local TensorFlow cluster: one process per task, each running CMD "
        "with its own TF_CONFIG, HYBRIDPAR_TASK and HYBRIDPAR_RESTART.",
    )
    parser.add_argument("--workers", type=int, required=True, help="number of worker tasks")
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter-server tasks; > 0 adds a chief (parameter-server mode)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart at most K times after a task fails: the whole cluster, or in "
        "parameter-server mode a failed worker alone",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"stop everything after SECONDS and exit {TIMEOUT_EXIT_CODE}",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address the tasks listen on")
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        help="seconds between SIGTERM and SIGKILL when stopping tasks",
    )
    return parser


def parse_launch_args(argv: Sequence[str]) -> LaunchOptions:
    """Parses ``hybridpar launch`` arguments (without the program name).

    Raises:
        UsageError: for bad flags, counts, durations or a missing ``-- CMD``.
    """
    argv = list(argv)
    flags, command = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = _launch_parser()
    args, extra = parser.parse_known_args(flags)
    unknown = [item for item in extra if item.startswith("-")]
    if unknown:
        options = [o for action in parser._actions for o in action.option_strings]
        raise UsageError(
            f"unrecognized option {unknown[0]!r}.{did_you_mean(unknown[0], options)} "
            f"Options: {', '.join(o for o in options if o.startswith('--'))}."
        )
    if extra:
        raise UsageError(
            f"the command must come after `--`. Received: hybridpar launch {shlex.join(argv)}. "
            f"Write e.g. {_LAUNCH_EXAMPLE}."
        )
    if not command:
        got = f"hybridpar launch {shlex.join(argv)}".rstrip()
        raise UsageError(
            f"missing the command to run: put it after `--`. Received: {got}. "
            f"Write e.g. {_LAUNCH_EXAMPLE}."
        )
    check_launch_options(args.workers, args.ps, args.max_restarts, args.timeout, args.grace)
    return LaunchOptions(
        command, args.workers, args.ps, args.max_restarts, args.timeout, args.host, args.grace
    )


def _run_parsing(prog: str, parse: Callable[[], Any]) -> tuple[Any, int | None]:
    """Calls ``parse``; returns ``(result, None)`` or ``(None, exit_code)`` after printing."""
    try:
        return parse(), None
    except _ParserExit as done:  # --help
        if done.message:
            print(done.message, file=sys.stderr, end="")
        return None, done.status
    except UsageError as err:
        print(f"{prog}: error: {err}\nRun `{prog} --help` for usage.", file=sys.stderr)
        return None, USAGE_EXIT_CODE


def main(argv: list[str]) -> int:
    """``hybridpar launch ...`` (argv without the program name); returns the exit code."""
    options, code = _run_parsing("hybridpar launch", lambda: parse_launch_args(argv))
    if code is not None:
        return code
    return launch(
        options.command,
        options.workers,
        options.ps,
        max_restarts=options.max_restarts,
        timeout=options.timeout,
        host=options.host,
        grace=options.grace,
    )


def tf_config_from_args(argv: Sequence[str]) -> dict:
    """Parses ``hybridpar tf-config`` arguments and returns the TF_CONFIG dict.

    Raises:
        UsageError: for malformed addresses, duplicate addresses, an unknown
            ``--type`` or an ``--index`` out of range.
    """
    parser = _Parser(
        prog="hybridpar tf-config",
        description="Print the TF_CONFIG JSON of one task of a multi-machine cluster.",
    )
    parser.add_argument("--workers", required=True, help="host:port,host:port,... of the workers")
    parser.add_argument("--chief", default=None, help="host:port of the chief (optional)")
    parser.add_argument("--ps", default=None, help="host:port,... of the parameter servers")
    parser.add_argument("--type", default="worker", help="this machine's task type")
    parser.add_argument("--index", type=int, required=True, help="this machine's task index")
    args = parser.parse_args(list(argv))
    cluster: dict[str, list[str]] = {}
    if args.chief is not None:
        cluster["chief"] = [parse_address(args.chief, "--chief")]
    cluster["worker"] = parse_address_list(args.workers, "--workers")
    if args.ps is not None:
        cluster["ps"] = parse_address_list(args.ps, "--ps")
    check_unique_addresses(cluster)
    return make_tf_config(cluster, args.type, args.index)


def tf_config_main(argv: list[str]) -> int:
    """``hybridpar tf-config ...``: prints the TF_CONFIG JSON; returns the exit code."""
    config, code = _run_parsing("hybridpar tf-config", lambda: tf_config_from_args(argv))
    if code is not None:
        return code
    print(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

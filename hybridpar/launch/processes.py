"""The processes of one run of a local cluster, and the launcher's own signals.

Each task runs as a child in its own session, so stopping a task reaches its
whole process tree. Output is read line by line and re-printed with the task
as a prefix.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

from hybridpar.exit_codes import TIMEOUT_EXIT_CODE, exit_status
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    Outcome,
    ends_cluster,
    evaluator_exit_line,
    is_ps_mode,
    ps_mode_exit,
    task_environment,
    task_restart_line,
)
from hybridpar.topology.cluster import Task, cluster_spec

_POLL_SECONDS = 0.05


class Output:
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
        output: Output | None = None,
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
        self._output = output or Output()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._readers: list[threading.Thread] = []
        self._status: dict[int, int] = {}
        self._last_trainer: Task | None = None

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

    def _status_of(self, task_type: str) -> int | None:
        """The exit status of the first task of ``task_type``, or None while it runs (or
        when there is none)."""
        for i, task in enumerate(self.tasks):
            if task.type == task_type:
                return self._status.get(i)
        return None

    def _evaluator_running(self) -> bool:
        return any(t.type == "evaluator" and i not in self._status
                   for i, t in enumerate(self.tasks))

    def _finished(self, task: Task) -> Outcome:
        evaluator = self._status_of("evaluator")
        return Outcome("finished", 0, task, evaluator_status=evaluator)

    def _training_done(self) -> bool:
        if self.ps_mode:
            return self._status_of("chief") == 0
        return all(self._status.get(i) == 0 for i, t in enumerate(self.tasks)
                   if t.type != "evaluator")

    def _ps_mode_exit(self, i: int, status: int) -> Outcome | None:
        task = self.tasks[i]
        restarts_left = self.max_restarts - self.restart - self.task_restarts
        chief_done = task.type != "chief" and self._status_of("chief") == 0
        action = ps_mode_exit(task, status, self._workers_alive(), restarts_left,
                              evaluator_running=self._evaluator_running(), chief_done=chief_done)
        if action == "end" and task.type == "evaluator":
            return self._finished(Task("chief", 0))
        if action == "end":
            return Outcome("failed", status, task) if status else self._finished(task)
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
            if task.type == "evaluator":
                line = evaluator_exit_line(status, self._training_done())
                if line:
                    self._output.info(line)
            else:
                self._last_trainer = task
            if self.ps_mode:
                outcome = self._ps_mode_exit(i, status)
                if outcome is not None:
                    return outcome
                continue
            if ends_cluster(task, status, self.ps_mode):
                return Outcome("failed" if status else "finished", status, task)
            if len(self._status) == len(self._procs):
                return self._finished(self._last_trainer)
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


class SignalWatcher:
    """Records SIGINT/SIGTERM/SIGHUP while active (main thread only).

    SIGINT and SIGTERM are always handled, even when the caller ignored them (as a
    shell does for background jobs); an ignored SIGHUP (nohup) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalWatcher:
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



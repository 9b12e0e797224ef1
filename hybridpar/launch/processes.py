"""The processes of one run of a local cluster.

Each task runs as a child in its own session, so stopping a task reaches its
whole process tree. Its stdout and stderr are read as they come (progress
bars end updates with a carriage return, not a newline) and handed to the
task's ``output.TaskOutput``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO

from hybridpar.exit_codes import exit_status
from hybridpar.launch.cluster_run import POLL_SECONDS, ClusterRun, Outputs, TaskStartError
from hybridpar.launch.output import Console, TaskOutput
from hybridpar.launch.signals import SignalWatcher
from hybridpar.launch.tasks import DEFAULT_GRACE, task_environment
from hybridpar.topology.cluster import Task

__all__ = ["Console", "LocalCluster", "SignalWatcher", "pump", "stop_process_groups"]

CHUNK_BYTES = 65536


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


def pump(pipe: IO[bytes], stream: str, output: TaskOutput) -> None:
    """Hands every chunk read from ``pipe`` to ``output`` until the pipe closes."""
    with pipe:
        for chunk in iter(lambda: pipe.read1(CHUNK_BYTES), b""):
            output.feed(stream, chunk)


def stop_process_groups(
    pgids: Sequence[int],
    procs: Sequence[subprocess.Popen[bytes]],
    grace: float = DEFAULT_GRACE,
    hurry: Callable[[], bool] = lambda: False,
) -> None:
    """SIGTERM to every process group, SIGKILL to those alive after ``grace`` s.

    Returns once no process of the groups is alive (zombies aside), or after
    10 s more. ``hurry()`` returning True skips the grace.
    """
    live = _live_groups(pgids)
    _signal_groups(live, signal.SIGTERM)
    end = time.monotonic() + grace
    while live and time.monotonic() < end and not hurry():
        time.sleep(POLL_SECONDS)
        for proc in procs:
            proc.poll()
        live = _live_groups(pgids)
    if live:
        _signal_groups(live, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    end = time.monotonic() + 10
    while _live_groups(pgids) and time.monotonic() < end:
        time.sleep(POLL_SECONDS)


class LocalCluster(ClusterRun):
    """One run of a local cluster: every task is a child process with its own TF_CONFIG.

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
        outputs: Outputs | None = None,
        task_restarts: int = 0,
        max_restarts: int = 0,
    ) -> None:
        super().__init__(command, tasks, addresses, restart=restart, outputs=outputs,
                         task_restarts=task_restarts, max_restarts=max_restarts)
        self._env = dict(os.environ if env is None else env)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._all_procs: list[subprocess.Popen[bytes]] = []
        self._readers: dict[int, list[threading.Thread]] = {}

    @property
    def pids(self) -> list[int]:
        """The pids (== process-group ids) of the started tasks."""
        return [proc.pid for proc in self._all_procs]

    def _spawn(self, i: int, restart: int, output: TaskOutput) -> None:
        task = self.tasks[i]
        try:
            proc = subprocess.Popen(
                self.command,
                env=task_environment(self._env, self.cluster, task, restart),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            raise TaskStartError(
                f"cannot start {self.command[0]!r}: {err}. Check that {self.command[0]!r} "
                f"is on PATH (or give its path) and is executable.",
                126 if isinstance(err, PermissionError) else 127,
            ) from None
        self._procs[i] = proc
        self._all_procs.append(proc)
        readers = self._readers[i] = []
        for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            reader = threading.Thread(target=pump, args=(pipe, stream, output), daemon=True,
                                      name=f"hybridpar-launch-{task}-{stream}")
            reader.start()
            readers.append(reader)

    def _drain(self, i: int) -> None:
        for reader in self._readers.get(i, ()):
            reader.join(timeout=2)

    def _returncode(self, i: int) -> int | None:
        code = self._procs[i].poll()
        return None if code is None else exit_status(code)

    def stop(self, grace: float = DEFAULT_GRACE, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stops every task's process group; returns once the output readers drained."""
        stop_process_groups(self.pids, self._all_procs, grace, hurry)
        end = time.monotonic() + 2  # a process that left its group may hold a pipe open
        for reader in [r for readers in self._readers.values() for r in readers]:
            reader.join(timeout=max(0.01, end - time.monotonic()))
        self.close_outputs()

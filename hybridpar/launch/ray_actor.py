"""The Ray actor of one task: runs the task's command as a child process on its node.

``ray_engine`` wraps ``TaskProcess`` with ``ray.remote`` (one actor per task).
The actor reserves a free port on its node for the task's TF_CONFIG address,
starts the command in its own session with the environment the launcher
gives (on top of the actor's own, so Ray's ``CUDA_VISIBLE_DEVICES`` stays),
buffers its output for the launcher to fetch, and stops its process group
as the local engine does. The exit status is reported only once both
output pipes are drained, so the last lines are never lost.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO

from hybridpar.exit_codes import exit_status
from hybridpar.launch.processes import CHUNK_BYTES, stop_process_groups

Chunks = list[tuple[str, bytes]]


class TaskProcess:
    """One task's child process on this node (the body of a Ray actor)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._chunks: collections.deque[tuple[str, bytes]] = collections.deque()
        self._held: socket.socket | None = None

    def reserve_address(self) -> tuple[str, int]:
        """``(node ip, port)``: a port free on this node, held until ``start``."""
        import ray

        host = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._held = socket.socket(family, socket.SOCK_STREAM)
        self._held.bind(("", 0))  # free on every interface, as TensorFlow's server binds
        return host, self._held.getsockname()[1]

    def start(
        self, command: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> tuple[str, int] | None:
        """Starts ``command``; returns ``(error, exit code)`` when it cannot start."""
        if self._held is not None:
            self._held.close()
            self._held = None
        try:
            self._proc = subprocess.Popen(
                list(command),
                env={**os.environ, **env},
                cwd=cwd if os.path.isdir(cwd) else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            return str(err), 126 if isinstance(err, PermissionError) else 127
        self._readers = [
            threading.Thread(target=self._pump, args=(pipe, stream), daemon=True)
            for pipe, stream in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr"))
        ]
        for reader in self._readers:
            reader.start()
        return None

    def _pump(self, pipe: IO[bytes], stream: str) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read1(CHUNK_BYTES), b""):
                self._chunks.append((stream, chunk))

    def read(self) -> tuple[Chunks, int | None]:
        """The output since the last read, and the exit status once the task ended."""
        status = None
        ended = self._proc is not None and self._proc.poll() is not None
        if ended and not any(reader.is_alive() for reader in self._readers):
            status = exit_status(self._proc.returncode)
        chunks = []
        while self._chunks:
            chunks.append(self._chunks.popleft())
        return chunks, status

    def stop(self, grace: float) -> tuple[Chunks, int | None]:
        """Stops the task's process group (SIGTERM, SIGKILL after ``grace`` s); the last output."""
        if self._proc is not None:
            stop_process_groups([self._proc.pid], [self._proc], grace)
            for reader in self._readers:
                reader.join(timeout=2)
        return self.read()

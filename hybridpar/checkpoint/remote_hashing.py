"""Each parameter server hashes the checkpoint files it wrote; the chief only collects.

In parameter-server mode a ps task's own process writes its data file of a
checkpoint (``tensor_io.write``). Its size and SHA-256 for the manifest are
computed there too, from the file it wrote, so the chief never reads a
table back. The ps tasks' Python only serves (``strategies.parameter_server``),
so the request goes through the checkpoint directory they share with the
chief:

- a ps task whose config has ``checkpoint.dir`` runs ``serve_in_background``:
  it announces itself with ``.hybridpar-hasher-<task>`` in the directory and
  polls the partial checkpoints for ``.hash-request-<task>.json``;
- the chief (``Requester``) writes the request, waits for
  ``.hash-<task>.json`` and removes both before the checkpoint is published.

A ps task that never announced itself (its script gave ``checkpoint.dir``
to the callback only) or does not answer within ``timeout_seconds`` has its
files hashed by the chief instead, and the log says so once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from hybridpar.checkpoint import storage
from hybridpar.checkpoint.manifest import PARTIAL_PREFIX

logger = logging.getLogger("hybridpar")

POLL_SECONDS = 0.05


def _safe(task: str) -> str:
    return task.replace(":", "-")


def marker(directory: str | os.PathLike, task: str) -> Any:
    return storage.join(directory, f".hybridpar-hasher-{_safe(task)}")


def request_file(partial: str | os.PathLike, task: str) -> Any:
    return storage.join(partial, f".hash-request-{_safe(task)}.json")


def answer_file(partial: str | os.PathLike, task: str) -> Any:
    return storage.join(partial, f".hash-{_safe(task)}.json")


def _write_atomically(path: Any, data: dict[str, Any]) -> None:
    temporary = f"{os.fspath(path)}.tmp-{os.getpid()}"
    storage.write_bytes(temporary, json.dumps(data).encode())
    storage.rename(temporary, path)


def hash_files(partial: str | os.PathLike, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of files in ``partial``, read in chunks."""
    result = {}
    for name in names:
        size, digest = storage.sha256_of(storage.join(partial, name))
        result[name] = {"bytes": size, "sha256": digest}
    return result


def answer_pending(directory: str | os.PathLike, task: str) -> int:
    """Answers every request for ``task`` in the partial checkpoints; returns how many."""
    answered = 0
    for name in storage.listdir(directory):
        if not name.startswith(PARTIAL_PREFIX):
            continue
        partial = storage.join(directory, name)
        request = request_file(partial, task)
        try:
            names = json.loads(storage.read_text(request))["files"]
        except (FileNotFoundError, ValueError, KeyError):
            continue
        try:
            answer: dict[str, Any] = {"files": hash_files(partial, names)}
        except FileNotFoundError as err:
            answer = {"error": f"missing {err}"}
        storage.remove(request)  # before answering: the chief publishes once it has the answer
        _write_atomically(answer_file(partial, task), answer)
        answered += 1
    return answered


def serve_in_background(directory: str | os.PathLike, task: str) -> threading.Thread:
    """On a ps task: answers hash requests in ``directory`` until the process ends."""
    storage.makedirs(directory)
    storage.write_bytes(marker(directory, task), str(os.getpid()).encode())

    def loop() -> None:
        while True:
            try:
                answer_pending(directory, task)
            except Exception as err:  # a transient listing error: keep serving
                logger.warning("hybridpar: %s could not answer a checkpoint hash request: %s",
                               task, err)
            time.sleep(POLL_SECONDS)

    thread = threading.Thread(target=loop, name=f"hybridpar-hasher-{task}", daemon=True)
    thread.start()
    return thread


class Requester:
    """The chief's side: asks the task that wrote files for their sizes and SHA-256."""

    def __init__(self, directory: str | os.PathLike, timeout_seconds: float = 120.0) -> None:
        self.directory = directory
        self.timeout_seconds = timeout_seconds
        self._said: set[str] = set()

    def __call__(self, partial: str | os.PathLike, task: str,
                 names: list[str]) -> dict[str, dict[str, Any]]:
        if not storage.exists(marker(self.directory, task)):
            self._fallback(task, "its script's hybridpar.scope() config has no checkpoint.dir")
            return hash_files(partial, names)
        _write_atomically(request_file(partial, task), {"files": names})
        answer = answer_file(partial, task)
        end = time.monotonic() + self.timeout_seconds
        while time.monotonic() < end:
            try:
                reply = json.loads(storage.read_text(answer))
            except (FileNotFoundError, ValueError):
                time.sleep(POLL_SECONDS / 2)
                continue
            storage.remove(answer)
            if "error" in reply:
                raise FileNotFoundError(f"{task} could not hash its checkpoint files: "
                                        f"{reply['error']}")
            return reply["files"]
        storage.remove(request_file(partial, task))
        self._fallback(task, f"it did not answer within {self.timeout_seconds:g} s")
        return hash_files(partial, names)

    def _fallback(self, task: str, why: str) -> None:
        if task not in self._said:
            self._said.add(task)
            logger.warning("hybridpar: %s did not hash the checkpoint files it wrote (%s); the "
                           "chief reads them back to hash them.", task, why)

"""What a person sees of a cluster's output, and the full log of every task (pure Python).

Every task's stdout and stderr arrive as bytes (from a pipe, or from a Ray
actor). ``Splitter`` cuts them into *lines* (ended by ``\\n``) and *updates*
(ended by ``\\r``: Keras's progress bar redraws itself with ``\\b...\\r``
before every update and ends an epoch with ``\\n``). Then:

- the log file of the task (``<log dir>/<type>-<index>.log``) gets every
  line, without terminal escapes; updates are left out (each epoch's bar
  ends in a line), except an update that no line followed (a task that died
  mid-epoch);
- the console shows the *shown task* (the chief: ``chief:0``, else
  ``worker:0``) whole: its updates redraw one live line on a terminal and are
  dropped elsewhere, so an epoch is one line when the output is not a terminal;
- of the other tasks the console shows warnings and errors only: Python
  tracebacks, stderr lines that name a warning, error, exception or fatal
  condition (or are TensorFlow/absl ``W``/``E``/``F`` log lines) and
  hybridpar's own log lines from WARNING up. hybridpar's log lines carry their
  level in a tag when ``HYBRIDPAR_LOG_TAGS=1`` (set by the launcher; see
  ``hybridpar.logs``); the tag is removed here. ``--console all`` shows every
  task whole.
"""

from __future__ import annotations

import codecs
import collections
import re
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Literal

from hybridpar.logs import LOG_TAG
from hybridpar.topology.cluster import Task

CONSOLE_MODES = ("chief", "all")
TAIL_LINES = 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SEVERE = re.compile(r"warning|error|exception|fatal|critical|traceback", re.IGNORECASE)
_ABSL_SEVERE = re.compile(r"^[WEF]\d{4} ")  # absl / TensorFlow C++: W1201 12:00:00.1 ...
_LEVELS_SHOWN = ("WARNING", "ERROR", "CRITICAL")

Kind = Literal["line", "update"]


def shown_task(tasks: Sequence[Task]) -> Task:
    """The task whose output the console shows whole: the chief, else ``worker:0``."""
    chiefs = [task for task in tasks if task.type == "chief"]
    return chiefs[0] if chiefs else Task("worker", 0)


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves)."""
    return _ANSI.sub("", text)


class Splitter:
    """Cuts a byte stream into lines (``\\n``) and updates (``\\r``), decoding UTF-8."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._after_cr = False  # the pending text follows a "\r": an unfinished update

    def feed(self, data: bytes) -> list[tuple[Kind, str]]:
        """The lines and updates completed by ``data``, in order."""
        text = self._pending + self._decoder.decode(data)
        text = text.replace("\r\n", "\n")
        if text.endswith("\r"):  # a "\n" may follow in the next chunk
            text, self._pending = text[:-1], "\r"
        else:
            self._pending = ""
        pieces = re.split(r"([\r\n])", text)
        self._pending = pieces.pop() + self._pending
        if len(pieces) > 1:
            self._after_cr = pieces[-1] == "\r"
        events: list[tuple[Kind, str]] = []
        for piece, end in zip(pieces[::2], pieces[1::2], strict=True):
            piece = piece.replace("\b", "")
            if end == "\n":
                events.append(("line", piece))
            elif piece.strip():
                events.append(("update", piece))
        return events

    def close(self) -> list[tuple[Kind, str]]:
        """What is left when the stream ends: a line, or an update if it followed a ``\\r``."""
        rest = (self._pending + self._decoder.decode(b"", final=True)).replace("\b", "")
        self._pending = ""
        rest = rest.rstrip("\r")
        return [("update" if self._after_cr else "line", rest)] if rest.strip() else []


def untag(text: str) -> tuple[str | None, str]:
    """``(level, message)`` of a tagged hybridpar log line, else ``(None, text)``."""
    if text.startswith(LOG_TAG):
        level, sep, message = text[len(LOG_TAG) :].partition(LOG_TAG)
        if sep:
            return level, message
    return None, text


class Sieve:
    """Decides which lines of a task that is not shown whole reach the console."""

    def __init__(self) -> None:
        self._in_traceback = False

    def keep(self, stream: str, level: str | None, text: str) -> bool:
        """True for warnings and errors: tracebacks, severe stderr lines, WARNING+ logs."""
        if text.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
            return True
        if self._in_traceback:
            ends = text[:1].strip() and not text.startswith(("During handling", "The above"))
            self._in_traceback = not ends
            return True
        if level is not None:
            return level in _LEVELS_SHOWN
        return stream == "stderr" and bool(
            _SEVERE.search(text) or _ABSL_SEVERE.match(text)
        )


class Console:
    """The launcher's stdout/stderr: whole lines under one lock, plus one live line.

    On a terminal (``live=None`` asks ``stdout.isatty()``) the shown task's
    progress-bar updates redraw a single line at the bottom; other lines are
    printed above it. Elsewhere updates are dropped.
    """

    def __init__(
        self,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
        live: bool | None = None,
    ) -> None:
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        if live is None:
            live = bool(getattr(self.stdout, "isatty", lambda: False)())
        self.live = live
        self._live_text = ""
        self._lock = threading.Lock()

    def _put(self, stream: IO[str], text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: keep draining the tasks
            pass

    def _clear_live(self) -> None:
        if self._live_text:
            self._put(self.stdout, "\r\x1b[K")

    def _draw_live(self) -> None:
        if self._live_text:
            self._put(self.stdout, self._live_text)

    def write(self, stream: IO[str], line: str) -> None:
        """Prints ``line`` on ``stream`` (above the live line, if there is one)."""
        with self._lock:
            self._clear_live()
            self._put(stream, line + "\n")
            self._draw_live()

    def update(self, line: str) -> None:
        """Redraws the live line with ``line`` (on a terminal; ignored elsewhere)."""
        if not self.live:
            return
        width = max(20, shutil.get_terminal_size().columns - 1)
        if len(strip_escapes(line)) > width:
            line = strip_escapes(line)[:width]
        with self._lock:
            self._clear_live()
            self._live_text = line
            self._put(self.stdout, "\r" + line + "\x1b[K")

    def end_live(self) -> None:
        """Forgets the live line (the line that completes it was printed or is coming)."""
        with self._lock:
            self._clear_live()
            self._live_text = ""

    def info(self, text: str) -> None:
        """A ``hybridpar launch: ...`` line on stderr."""
        self.write(self.stderr, f"hybridpar launch: {text}")


class TaskOutput:
    """One task's two output streams: to its log file, and what the console shows."""

    def __init__(
        self, task: Task, console: Console, log: Path | None, whole: bool, restart: int = 0
    ) -> None:
        self.task = task
        self.whole = whole
        self.log_path = log
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._console = console
        self._prefix = f"[{task}] "
        self._splitters = {"stdout": Splitter(), "stderr": Splitter()}
        self._sieves = {"stdout": Sieve(), "stderr": Sieve()}
        self._last_update: dict[str, str] = {}
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(log, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            self._file.write(f"===== hybridpar launch: {task} started at {stamp} "
                             f"(restart {restart}) =====\n")
            self._file.flush()

    def feed(self, stream: str, data: bytes) -> None:
        """Takes the next bytes the task wrote to ``stream`` (``stdout`` or ``stderr``)."""
        for kind, text in self._splitters[stream].feed(data):
            self._handle(stream, kind, text)

    def close(self) -> None:
        """Flushes what is left of both streams and closes the log file."""
        for stream, splitter in self._splitters.items():
            for kind, text in splitter.close():
                self._handle(stream, kind, text)
            if stream in self._last_update:
                self._log(self._last_update.pop(stream))
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _log(self, text: str) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write(strip_escapes(text) + "\n")
                    self._file.flush()
                except (OSError, ValueError):
                    pass

    def _handle(self, stream: str, kind: Kind, text: str) -> None:
        level, text = untag(text)
        target = self._console.stdout if stream == "stdout" else self._console.stderr
        if kind == "update":
            self._last_update[stream] = text
            if self.whole and stream == "stdout":
                self._console.update(self._prefix + text)
            return
        self._last_update.pop(stream, None)
        self._log(text)
        self.tail.append(strip_escapes(text))
        if self.whole:
            if stream == "stdout":
                self._console.end_live()
            shown = text if self._console.live else strip_escapes(text)
            self._console.write(target, self._prefix + shown)
        elif self._sieves[stream].keep(stream, level, text):
            self._console.write(target, self._prefix + strip_escapes(text))


def log_file(log_dir: Path | None, task: Task) -> Path | None:
    """``<log_dir>/worker-1.log`` for ``worker:1`` (``None`` without a log dir)."""
    return None if log_dir is None else log_dir / f"{task.type}-{task.index}.log"


def default_log_dir(root: str = "runs") -> Path:
    """``runs/launch/<YYYYmmdd-HHMMSS>``: where ``--log-dir`` defaults to (a fresh one)."""
    base = Path(root) / "launch" / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path

"""The launcher's own signals: SIGINT/SIGTERM/SIGHUP stop the cluster, a second one hurries."""

from __future__ import annotations

import signal
import threading
from typing import Any


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



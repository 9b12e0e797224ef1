"""The `hybridpar launch` command line of the multi-worker tests.

These tests read every task's lines (``[worker:1] hybridpar: ...``), so the
console shows every task whole (``--console all``); the per-task log files go
to one temporary directory per test process instead of ``runs/launch/``.
"""

import atexit
import shutil
import sys
import tempfile

LOG_DIR = tempfile.mkdtemp(prefix="hybridpar-test-launch-logs-")
atexit.register(shutil.rmtree, LOG_DIR, ignore_errors=True)


def launch_command(*flags: str, console: str = "all") -> list[str]:
    """``python -m hybridpar.launch --console all --log-dir <tmp> FLAGS...``."""
    return [sys.executable, "-m", "hybridpar.launch", "--console", console,
            "--log-dir", LOG_DIR, *flags]

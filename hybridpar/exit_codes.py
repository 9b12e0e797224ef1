"""Exit codes shared by training processes and the launcher (pure Python)."""

from __future__ import annotations

import signal

PREEMPTED_EXIT_CODE = 42
"""A task got SIGTERM, saved a checkpoint and exited (TensorFlow's own restart code
outside GCP); ``hybridpar launch --max-restarts`` restarts it."""
TIMEOUT_EXIT_CODE = 124
"""``hybridpar launch --timeout`` stopped the cluster."""
USAGE_EXIT_CODE = 2
"""Bad command-line or config input."""


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

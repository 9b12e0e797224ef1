"""``run(options)``: a launch on the engine its options name; Ray is imported only for Ray."""

from __future__ import annotations

from collections.abc import Mapping

from hybridpar.launch import local
from hybridpar.launch.options import LaunchOptions
from hybridpar.launch.output import Console


def run(
    options: LaunchOptions,
    *,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
) -> int:
    """Runs ``options`` on ``options.engine`` (``local.run`` or ``ray_engine.run``).

    Returns:
        The launch's exit code (see ``hybridpar.launch``).

    Raises:
        UsageError: what the engine finds before any task starts (for Ray: Ray
            missing, an unreachable ``--address``, resources it does not have).
    """
    if options.engine == "ray":
        from hybridpar.launch import ray_engine

        return ray_engine.run(options, env=env, console=console)
    return local.run(options, env=env, console=console)

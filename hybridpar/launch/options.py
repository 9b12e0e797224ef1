"""``LaunchOptions``: one launch of a cluster, whatever the engine, checked once (pure).

Every way in (``hybridpar launch``'s flags, ``hybridpar.launch.launch(...)``)
builds a ``LaunchOptions``, and building it runs every check a launch needs
before any process starts; the engines (``local.run``, ``ray_engine.run``,
dispatched by ``engines.run``) take it as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hybridpar.config import did_you_mean
from hybridpar.launch.output import CONSOLE_MODES
from hybridpar.launch.ports import DEFAULT_HOST
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    LAUNCH_EXAMPLE,
    UsageError,
    check_counts,
    task_layout,
)
from hybridpar.topology.cluster import Task

ENGINES = ("local", "ray")
DEFAULT_CPUS_PER_TASK = 1.0
DEFAULT_GPUS_PER_TASK = 0.0
RAY_ONLY = {"address": "--address", "cpus_per_task": "--cpus-per-task",
            "gpus_per_task": "--gpus-per-task"}


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """One launch: the command, the cluster's tasks, restarts, output and the engine.

    ``cpus_per_task``/``gpus_per_task`` are the Ray engine's reservations
    (``None``: ``DEFAULT_CPUS_PER_TASK``/``DEFAULT_GPUS_PER_TASK``); ``log_dir``
    ``None`` writes no task logs.

    Raises:
        UsageError: from the constructor, for anything a launch cannot use
            (see ``check_options``).
    """

    command: list[str]
    workers: int
    ps: int = 0
    max_restarts: int = 0
    timeout: float | None = None
    host: str = DEFAULT_HOST
    grace: float = DEFAULT_GRACE
    engine: str = "local"
    address: str | None = None
    cpus_per_task: float | None = None
    gpus_per_task: float | None = None
    log_dir: str | None = None
    console: str = "chief"
    evaluator: bool = False

    def __post_init__(self) -> None:
        check_options(self)

    @property
    def tasks(self) -> list[Task]:
        """The cluster's tasks (``tasks.task_layout``), whatever the engine."""
        return task_layout(self.workers, self.ps, self.evaluator)

    @property
    def cpus(self) -> float:
        """CPUs the Ray engine reserves for each task."""
        return DEFAULT_CPUS_PER_TASK if self.cpus_per_task is None else self.cpus_per_task

    @property
    def gpus(self) -> float:
        """GPUs the Ray engine reserves for each task."""
        return DEFAULT_GPUS_PER_TASK if self.gpus_per_task is None else self.gpus_per_task


def check_options(options: LaunchOptions) -> None:
    """Raises UsageError for anything in ``options`` a launch cannot use."""
    if not options.command:
        raise UsageError(f"no command to run. Put it after `--`, e.g. {LAUNCH_EXAMPLE}.")
    check_counts(options.workers, options.ps)
    if options.max_restarts < 0:
        raise UsageError(
            f"--max-restarts must be 0 or more. Received: --max-restarts {options.max_restarts}. "
            f"Use 0 (the default) to never restart."
        )
    if options.timeout is not None and not options.timeout > 0:
        raise UsageError(
            "--timeout must be a positive number of seconds. Received: --timeout "
            f"{options.timeout:g}. Omit --timeout to wait without a limit."
        )
    if not options.grace >= 0:
        raise UsageError(f"--grace must be 0 or more seconds. Received: --grace {options.grace:g}.")
    check_choice("--engine", options.engine, ENGINES)
    check_choice("--console", options.console, CONSOLE_MODES)
    if options.engine != "ray":
        for name, flag in RAY_ONLY.items():
            if getattr(options, name) is not None:
                raise UsageError(
                    f"{flag} is for the Ray engine. Received: {flag} {getattr(options, name)} "
                    f"with --engine {options.engine}. Add --engine ray, or drop {flag}."
                )
    for flag, value in (("--cpus-per-task", options.cpus_per_task),
                        ("--gpus-per-task", options.gpus_per_task)):
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be 0 or more. Received: {flag} {value:g}.")


def check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    """Raises UsageError, with a did-you-mean, unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise UsageError(
            f"unknown {flag} {value!r}.{did_you_mean(value, choices)} "
            f"Choose one of: {', '.join(choices)}. Received: {flag} {value}."
        )

"""Command-line arguments of ``hybridpar launch`` and ``hybridpar tf-config``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hybridpar.config import did_you_mean
from hybridpar.exit_codes import TIMEOUT_EXIT_CODE, USAGE_EXIT_CODE
from hybridpar.launch.local import launch
from hybridpar.launch.output import CONSOLE_MODES, default_log_dir
from hybridpar.launch.ports import (
    DEFAULT_HOST,
    check_unique_addresses,
    parse_address,
    parse_address_list,
)
from hybridpar.launch.tasks import (
    DEFAULT_GRACE,
    LAUNCH_EXAMPLE,
    UsageError,
    check_launch_options,
    make_tf_config,
    task_layout,
)
from hybridpar.topology.cluster import Task


class _ParserExit(Exception):
    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of calling ``sys.exit``."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ParserExit(status, message)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Parsed ``hybridpar launch`` arguments."""

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

    @property
    def tasks(self) -> list[Task]:
        """The cluster's tasks (``tasks.task_layout``), whatever the engine."""
        return task_layout(self.workers, self.ps)


ENGINES = ("local", "ray")
RAY_ONLY = {"address": "--address", "cpus_per_task": "--cpus-per-task",
            "gpus_per_task": "--gpus-per-task"}


def _launch_parser() -> _Parser:
    parser = _Parser(
        prog="hybridpar launch",
        usage="hybridpar launch [--engine local|ray] --workers N [--ps M] [--max-restarts K] "
        "[--timeout SECONDS] [--log-dir DIR] [--console chief|all] [--host HOST] "
        "[--grace SECONDS] [--address RAY_ADDRESS] [--cpus-per-task C] [--gpus-per-task G] "
        "-- CMD [ARGS...]",
        description="Start a TensorFlow cluster: one process per task, each running CMD "
        "with its own TF_CONFIG, HYBRIDPAR_TASK and HYBRIDPAR_RESTART; on this machine "
        "(--engine local) or as Ray actors (--engine ray).",
    )
    parser.add_argument(
        "--engine",
        default="local",
        help="local (processes on this machine, the default) or ray (one Ray actor per task)",
    )
    parser.add_argument("--workers", type=int, required=True, help="number of worker tasks")
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter-server tasks; > 0 adds a chief (parameter-server mode)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart at most K times after a task fails: the whole cluster, or in "
        "parameter-server mode a failed worker alone",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"stop everything after SECONDS and exit {TIMEOUT_EXIT_CODE}",
    )
    parser.add_argument(
        "--log-dir",
        default=None,
        help="directory for every task's full log (<type>-<index>.log); default: "
        "runs/launch/<date-time>",
    )
    parser.add_argument(
        "--console",
        default="chief",
        help="chief: show the chief's output and the other tasks' warnings and errors "
        "(default); all: show every task's output",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address the tasks listen on (with --engine ray: the node address of the local "
        "Ray cluster it starts)",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="--engine ray: the Ray cluster to use (host:port of its head, or auto); default: "
        "start a local one",
    )
    parser.add_argument("--cpus-per-task", type=float, default=None,
                        help="--engine ray: CPUs Ray reserves for each task (default 1)")
    parser.add_argument("--gpus-per-task", type=float, default=None,
                        help="--engine ray: GPUs Ray reserves for each task (default 0)")
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        help="seconds between SIGTERM and SIGKILL when stopping tasks",
    )
    return parser


def parse_launch_args(argv: Sequence[str]) -> LaunchOptions:
    """Parses ``hybridpar launch`` arguments (without the program name).

    Raises:
        UsageError: for bad flags, counts, durations or a missing ``-- CMD``.
    """
    argv = list(argv)
    flags, command = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = _launch_parser()
    args, extra = parser.parse_known_args(flags)
    unknown = [item for item in extra if item.startswith("-")]
    if unknown:
        options = [o for action in parser._actions for o in action.option_strings]
        raise UsageError(
            f"unrecognized option {unknown[0]!r}.{did_you_mean(unknown[0], options)} "
            f"Options: {', '.join(o for o in options if o.startswith('--'))}."
        )
    if extra:
        raise UsageError(
            f"the command must come after `--`. Received: hybridpar launch {shlex.join(argv)}. "
            f"Write e.g. {LAUNCH_EXAMPLE}."
        )
    if not command:
        got = f"hybridpar launch {shlex.join(argv)}".rstrip()
        raise UsageError(
            f"missing the command to run: put it after `--`. Received: {got}. "
            f"Write e.g. {LAUNCH_EXAMPLE}."
        )
    check_launch_options(args.workers, args.ps, args.max_restarts, args.timeout, args.grace)
    _check_choice("--engine", args.engine, ENGINES)
    _check_choice("--console", args.console, CONSOLE_MODES)
    if args.engine != "ray":
        for name, flag in RAY_ONLY.items():
            if getattr(args, name) is not None:
                raise UsageError(
                    f"{flag} is for the Ray engine. Received: {flag} {getattr(args, name)} with "
                    f"--engine {args.engine}. Add --engine ray, or drop {flag}."
                )
    for flag, value in (("--cpus-per-task", args.cpus_per_task),
                        ("--gpus-per-task", args.gpus_per_task)):
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be 0 or more. Received: {flag} {value:g}.")
    return LaunchOptions(
        command, args.workers, args.ps, args.max_restarts, args.timeout, args.host, args.grace,
        engine=args.engine, address=args.address, cpus_per_task=args.cpus_per_task,
        gpus_per_task=args.gpus_per_task, log_dir=args.log_dir, console=args.console,
    )


def _check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UsageError(
            f"unknown {flag} {value!r}.{did_you_mean(value, choices)} "
            f"Choose one of: {', '.join(choices)}. Received: {flag} {value}."
        )


def _run_parsing(prog: str, parse: Callable[[], Any]) -> tuple[Any, int | None]:
    """Calls ``parse``; returns ``(result, None)`` or ``(None, exit_code)`` after printing."""
    try:
        return parse(), None
    except _ParserExit as done:  # --help
        if done.message:
            print(done.message, file=sys.stderr, end="")
        return None, done.status
    except UsageError as err:
        print(f"{prog}: error: {err}\nRun `{prog} --help` for usage.", file=sys.stderr)
        return None, USAGE_EXIT_CODE


def main(argv: list[str]) -> int:
    """``hybridpar launch ...`` (argv without the program name); returns the exit code."""
    options, code = _run_parsing("hybridpar launch", lambda: parse_launch_args(argv))
    if code is not None:
        return code
    log_dir = options.log_dir or str(default_log_dir())
    if options.engine == "ray":
        from hybridpar.launch import ray_engine

        return _usage_errors(lambda: ray_engine.launch_on_ray(options, log_dir=log_dir))
    return launch(
        options.command,
        options.workers,
        options.ps,
        max_restarts=options.max_restarts,
        timeout=options.timeout,
        host=options.host,
        grace=options.grace,
        log_dir=log_dir,
        console=options.console,
    )


def _usage_errors(run: Callable[[], int]) -> int:
    """``run()``, with a UsageError raised there printed as ``hybridpar launch: error: ...``."""
    try:
        return run()
    except UsageError as err:
        print(f"hybridpar launch: error: {err}", file=sys.stderr)
        return USAGE_EXIT_CODE


def tf_config_from_args(argv: Sequence[str]) -> dict:
    """Parses ``hybridpar tf-config`` arguments and returns the TF_CONFIG dict.

    Raises:
        UsageError: for malformed addresses, duplicate addresses, an unknown
            ``--type`` or an ``--index`` out of range.
    """
    parser = _Parser(
        prog="hybridpar tf-config",
        description="Print the TF_CONFIG JSON of one task of a multi-machine cluster.",
    )
    parser.add_argument("--workers", required=True, help="host:port,host:port,... of the workers")
    parser.add_argument("--chief", default=None, help="host:port of the chief (optional)")
    parser.add_argument("--ps", default=None, help="host:port,... of the parameter servers")
    parser.add_argument("--type", default="worker", help="this machine's task type")
    parser.add_argument("--index", type=int, required=True, help="this machine's task index")
    args = parser.parse_args(list(argv))
    cluster: dict[str, list[str]] = {}
    if args.chief is not None:
        cluster["chief"] = [parse_address(args.chief, "--chief")]
    cluster["worker"] = parse_address_list(args.workers, "--workers")
    if args.ps is not None:
        cluster["ps"] = parse_address_list(args.ps, "--ps")
    check_unique_addresses(cluster)
    return make_tf_config(cluster, args.type, args.index)


def tf_config_main(argv: list[str]) -> int:
    """``hybridpar tf-config ...``: prints the TF_CONFIG JSON; returns the exit code."""
    config, code = _run_parsing("hybridpar tf-config", lambda: tf_config_from_args(argv))
    if code is not None:
        return code
    print(json.dumps(config))
    return 0

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
from hybridpar.launch import engines
from hybridpar.launch.options import DEFAULT_CPUS_PER_TASK, DEFAULT_GPUS_PER_TASK, LaunchOptions
from hybridpar.launch.output import default_log_dir
from hybridpar.launch.ports import (
    DEFAULT_HOST,
    check_unique_addresses,
    parse_address,
    parse_address_list,
)
from hybridpar.launch.tasks import DEFAULT_GRACE, LAUNCH_EXAMPLE, UsageError, make_tf_config


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


def _launch_parser() -> _Parser:
    parser = _Parser(
        prog="hybridpar launch",
        usage="hybridpar launch [--engine local|ray] --workers N [--ps M] [--evaluator] "
        "[--max-restarts K] "
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
        "--evaluator",
        action="store_true",
        help="add one evaluator task (sidecar evaluation of the chief's checkpoints); the "
        "cluster is done when the chief and the evaluator are, and an evaluator failure is "
        "reported without stopping training",
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
                        help="--engine ray: CPUs Ray reserves for each task "
                        f"(default {DEFAULT_CPUS_PER_TASK:g})")
    parser.add_argument("--gpus-per-task", type=float, default=None,
                        help="--engine ray: GPUs Ray reserves for each task "
                        f"(default {DEFAULT_GPUS_PER_TASK:g})")
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
    return LaunchOptions(
        command, args.workers, args.ps, args.max_restarts, args.timeout, args.host, args.grace,
        engine=args.engine, address=args.address, cpus_per_task=args.cpus_per_task,
        gpus_per_task=args.gpus_per_task, log_dir=args.log_dir, console=args.console,
        evaluator=args.evaluator,
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
    options = dataclasses.replace(options, log_dir=options.log_dir or str(default_log_dir()))
    return _usage_errors(lambda: engines.run(options))


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
    parser.add_argument("--evaluator", default=None,
                        help="host:port of the evaluator (at most one; it runs no server)")
    parser.add_argument("--type", default="worker",
                        help="this machine's task type: chief, worker, ps or evaluator")
    parser.add_argument("--index", type=int, required=True, help="this machine's task index")
    args = parser.parse_args(list(argv))
    cluster: dict[str, list[str]] = {}
    if args.chief is not None:
        cluster["chief"] = [parse_address(args.chief, "--chief")]
    cluster["worker"] = parse_address_list(args.workers, "--workers")
    if args.ps is not None:
        cluster["ps"] = parse_address_list(args.ps, "--ps")
    if args.evaluator is not None:
        if "," in args.evaluator:
            raise UsageError(
                "a cluster has at most one evaluator (TensorFlow's rule). Received: "
                f"--evaluator {args.evaluator!r}. Give one host:port."
            )
        cluster["evaluator"] = [parse_address(args.evaluator, "--evaluator")]
    check_unique_addresses(cluster)
    return make_tf_config(cluster, args.type, args.index)


def tf_config_main(argv: list[str]) -> int:
    """``hybridpar tf-config ...``: prints the TF_CONFIG JSON; returns the exit code."""
    config, code = _run_parsing("hybridpar tf-config", lambda: tf_config_from_args(argv))
    if code is not None:
        return code
    print(json.dumps(config))
    return 0

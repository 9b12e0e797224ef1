"""``hybridpar launch --engine ray``: every task is a Ray actor running CMD on its node.

The tasks, their TF_CONFIG, which exit ends the cluster or restarts a task,
and the summary lines are the local engine's (``launch.tasks``,
``launch.cluster_run``); only where the processes run differs. Per run:

1. connect to ``--address`` (a TCP probe first, then ``ray.init`` within
   ``CONNECT_TIMEOUT_SECONDS``) or start a local Ray instance sized for the
   tasks, and check that every task's ``--cpus-per-task``/``--gpus-per-task``
   fits a node and all of them fit the cluster, before any task starts;
2. create one ``ray_actor.TaskProcess`` actor per task (spread over the
   nodes); each reserves a port free on its node, and the TF_CONFIG cluster
   is built from those node addresses and ports;
3. start CMD in every actor with its TF_CONFIG, fetch the output of all of
   them every ``POLL_SECONDS`` into the same console and log files as the
   local engine, and stop them all as the policies say. A restart of the
   whole cluster makes new actors on new ports; in parameter-server mode a
   failed worker restarts alone in its actor, at the same address.

The launcher's ``HYBRIDPAR_*`` and ``TF_*`` variables (not ``TF_CONFIG``)
are passed on to the tasks; everything else comes from the node's Ray
worker environment. CMD runs in the launcher's working directory when that
exists on the node (a shared file system), else in the Ray worker's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridpar.launch.cluster_run import ClusterRun, Outputs, TaskStartError, run_cluster
from hybridpar.launch.options import LaunchOptions
from hybridpar.launch.output import Console, TaskOutput
from hybridpar.launch.ports import format_address
from hybridpar.launch.ray_actor import TaskProcess
from hybridpar.launch.signals import SignalWatcher
from hybridpar.launch.tasks import DEFAULT_GRACE, UsageError, task_environment
from hybridpar.topology.cluster import Task

RAY_INSTALL = 'pip install -e ".[ray]"'
CONNECT_TIMEOUT_SECONDS = 30.0
PLACE_TIMEOUT_SECONDS = 120.0
ACTOR_DIED_STATUS = 137  # as if SIGKILLed: the task is gone with its node or actor
FORWARDED_PREFIXES = ("HYBRIDPAR_", "TF_")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        UsageError: naming the install command when Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise UsageError(
            f"--engine ray needs Ray, which is not installed. Install it with {RAY_INSTALL} "
            "(from the hybridpar checkout), or use --engine local."
        ) from None
    return ray


def probe_address(address: str, timeout: float = 5.0) -> None:
    """Checks that ``host:port`` (or ``ray://host:port``) accepts TCP connections.

    Raises:
        UsageError: naming the address, the error and how to fix it.
    """
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise UsageError(
            f"--address expects the host:port of a Ray cluster's head (e.g. 10.0.0.1:6379, "
            f"ray://10.0.0.1:10001 or auto). Received: --address {address}."
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise UsageError(
            f"cannot reach the Ray cluster at --address {address} within {timeout:g} s ({err}). "
            "Check the address (`ray status` on the head node prints it), or omit --address "
            "to start a local Ray instance."
        ) from None


def _init_within(ray: Any, timeout: float, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, or UsageError when it has not returned within ``timeout`` s."""
    done = threading.Event()
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as err:  # reported to the caller below
            failure.append(err)
        finally:
            done.set()

    threading.Thread(target=connect, daemon=True, name="hybridpar-ray-init").start()
    if not done.wait(timeout):
        raise UsageError(
            f"the Ray cluster at --address {kwargs.get('address')} did not answer within "
            f"{timeout:g} s (something listens there, but not Ray's head?). Check the address, "
            "or omit --address to start a local Ray instance."
        )
    if failure:
        raise UsageError(f"cannot connect to Ray ({type(failure[0]).__name__}: {failure[0]}).")


def connect(options: LaunchOptions, num_tasks: int) -> None:
    """Connects to ``--address``, or starts a local Ray instance with a CPU per task at least."""
    if options.address is None and options.host in LOOPBACK:
        # One machine: keep all of Ray's traffic on loopback (read when ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = import_ray()
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    if options.address is not None:
        if options.address != "auto":
            probe_address(options.address)
        _init_within(ray, CONNECT_TIMEOUT_SECONDS, address=options.address, **quiet)
        return
    cpus = max(os.cpu_count() or 1, int(num_tasks * options.cpus + 0.999))
    ray.init(num_cpus=cpus, _node_ip_address=options.host, **quiet)


def check_resources(
    nodes: Sequence[Mapping[str, float]], num_tasks: int, cpus: float, gpus: float
) -> None:
    """Raises UsageError unless one task fits a node and all tasks fit the cluster.

    Args:
        nodes: the ``Resources`` of every live node (``CPU``, ``GPU``).
    """
    for kind, per_task, flag in (("CPU", cpus, "--cpus-per-task"),
                                 ("GPU", gpus, "--gpus-per-task")):
        if not per_task:
            continue
        largest = max((node.get(kind, 0.0) for node in nodes), default=0.0)
        total = sum(node.get(kind, 0.0) for node in nodes)
        if per_task > largest:
            raise UsageError(
                f"{flag} {per_task:g} asks for more {kind}s per task than any node of the Ray "
                f"cluster has: the largest node has {largest:g} {kind}(s) ({len(nodes)} node(s), "
                f"{total:g} in all). Lower {flag} or add bigger nodes."
            )
        if per_task * num_tasks > total:
            raise UsageError(
                f"{num_tasks} task(s) x {flag} {per_task:g} = {per_task * num_tasks:g} {kind}s, "
                f"but the Ray cluster has {total:g} {kind}(s) in all. Lower {flag}, run fewer "
                "tasks, or add nodes."
            )


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's variables every task gets: ``HYBRIDPAR_*`` and ``TF_*`` but TF_CONFIG."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith(FORWARDED_PREFIXES) and name != "TF_CONFIG"
    }


class RayCluster(ClusterRun):
    """One run of a cluster whose tasks run in Ray actors (see the module doc)."""

    def __init__(
        self,
        command: Sequence[str],
        tasks: Sequence[Task],
        actors: Sequence[Any],
        addresses: Sequence[str],
        *,
        ray: Any,
        env: Mapping[str, str],
        **kwargs: Any,
    ) -> None:
        super().__init__(command, tasks, addresses, **kwargs)
        self._ray = ray
        self._actors = list(actors)
        self._env = dict(env)
        self._codes: dict[int, int] = {}
        self._started: set[int] = set()

    def _spawn(self, i: int, restart: int, output: TaskOutput) -> None:
        env = task_environment(self._env, self.cluster, self.tasks[i], restart)
        error = self._ray.get(self._actors[i].start.remote(self.command, env, os.getcwd()))
        if error is not None:
            message, code = error
            raise TaskStartError(
                f"cannot start {self.command[0]!r} for task {self.tasks[i]} on its Ray node: "
                f"{message}. Check that {self.command[0]!r} is on PATH there (or give its path) "
                "and is executable.",
                code,
            )
        self._started.add(i)
        self._codes.pop(i, None)

    def _feed(self, i: int, chunks: Sequence[tuple[str, bytes]]) -> None:
        output = self.task_outputs[i]
        if output is not None:
            for stream, data in chunks:
                output.feed(stream, data)

    def _fetch(self) -> None:
        """Fetches every running task's new output and exit status, all actors at once."""
        running = [i for i in sorted(self._started) if i not in self._status | self._codes]
        refs = {i: self._actors[i].read.remote() for i in running}
        for i, ref in refs.items():
            try:
                chunks, status = self._ray.get(ref, timeout=60)
            except self._ray.exceptions.GetTimeoutError:
                continue
            except self._ray.exceptions.RayActorError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                self.outputs.console.info(f"the Ray actor of task {self.tasks[i]} died ({first})")
                chunks, status = [], ACTOR_DIED_STATUS
            self._feed(i, chunks)
            if status is not None:
                self._codes[i] = status

    def poll(self) -> Any:
        self._fetch()
        return super().poll()

    def _returncode(self, i: int) -> int | None:
        return self._codes.pop(i, None)

    def stop(self, grace: float = DEFAULT_GRACE, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stops every task in its actor, takes their last output, then ends the actors."""
        grace = 0.0 if hurry() else grace
        refs = {i: self._actors[i].stop.remote(grace) for i in sorted(self._started)}
        for i, ref in refs.items():
            with contextlib.suppress(Exception):  # a dead actor has nothing more to say
                chunks, _ = self._ray.get(ref, timeout=grace + 30)
                self._feed(i, chunks)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        self._started.clear()
        self.close_outputs()


def _cluster_line(nodes: Sequence[Mapping[str, float]], options: LaunchOptions) -> str:
    cpus = sum(node.get("CPU", 0.0) for node in nodes)
    gpus = sum(node.get("GPU", 0.0) for node in nodes)
    where = options.address or "a local Ray instance started for this launch"
    return (
        f"engine ray: {where} ({len(nodes)} node(s), {cpus:g} CPU(s), {gpus:g} GPU(s)); "
        f"each task reserves {options.cpus:g} CPU(s) and {options.gpus:g} GPU(s)"
    )


def run(
    options: LaunchOptions,
    *,
    env: Mapping[str, str] | None = None,
    console: Console | None = None,
) -> int:
    """Runs ``options.command`` as a cluster of Ray actors; returns the exit code.

    ``env`` is where the forwarded variables come from (``None``: this process's).

    Raises:
        UsageError: Ray missing, an unreachable ``--address``, resources the
            cluster does not have, or actors Ray cannot place in time.
    """
    tasks = options.tasks
    cpus, gpus = options.cpus, options.gpus
    connect(options, len(tasks))
    ray = import_ray()
    try:
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        check_resources(nodes, len(tasks), cpus, gpus)
        outputs = Outputs(console or Console(),
                          Path(options.log_dir) if options.log_dir else None, options.console)
        outputs.console.info(_cluster_line(nodes, options))
        remote = ray.remote(max_restarts=0)(TaskProcess)
        forwarded = forwarded_environment(os.environ if env is None else env)

        def new_run(restart: int) -> RayCluster:
            actors = [remote.options(num_cpus=cpus, num_gpus=gpus,
                                     scheduling_strategy="SPREAD").remote() for _ in tasks]
            try:
                places = ray.get([a.reserve_address.remote() for a in actors],
                                 timeout=PLACE_TIMEOUT_SECONDS)
            except ray.exceptions.GetTimeoutError:
                for actor in actors:
                    ray.kill(actor)
                raise UsageError(
                    f"Ray did not start the {len(tasks)} task actor(s) within "
                    f"{PLACE_TIMEOUT_SECONDS:g} s ({cpus:g} CPU(s), {gpus:g} GPU(s) each); "
                    "the cluster's resources are probably in use. `ray status` shows them."
                ) from None
            addresses = [format_address(host, port) for host, port in places]
            return RayCluster(options.command, tasks, actors, addresses, ray=ray, env=forwarded,
                              restart=restart, outputs=outputs,
                              max_restarts=options.max_restarts)

        with SignalWatcher() as signals:
            return run_cluster(new_run, max_restarts=options.max_restarts,
                               timeout=options.timeout, grace=options.grace, outputs=outputs,
                               signals=signals)
    finally:
        ray.shutdown()  # stops a local instance; from --address, only disconnects

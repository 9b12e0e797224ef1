"""Multi-worker figures on a real 2-worker localhost cluster: wire bytes and step time.

(a) ``bytes``: one cluster trains a ~10 MB MLP with ``model.fit`` under
``hybridpar.scope`` (``data_parallel.mode: multi_worker``). Worker 0 reads the
loopback TX counter of ``/proc/net/dev`` (and, as a cross-check, the TCP
payload and retransmissions of the cluster's own sockets from ``ss``) at the
start and end of the timed epoch. The total bytes both workers sent per step are divided by the
ring all-reduce volume ``2(n-1)*S`` (S: bytes of float32 trainable variables;
each of the n workers sends ``2(n-1)/n*S``, so all of them together send
``2(n-1)*S``).

(b) ``steps``: a mid-size MLP, same data and global batch, trained by
``model.fit`` under hybridpar and by a hand-written ``tf.distribute``
custom training loop on ``tf.distribute.MultiWorkerMirroredStrategy``. Each
run is its own cluster (this script re-invoked with ``--child`` under
``hybridpar.launch.launch``); runs come in A/B pairs whose order alternates.

The last two lines are ``bytes_ratio=<x>`` and ``step_ratio=<x>`` (``nan`` for
a part not run).

    python benchmarks/multiworker.py [--part both|bytes|steps] [--pairs 7] [--keep_remainder]
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ab_pairs import VARIANTS, pair_orders, summarize  # beside this script
from raw_loop import custom_train_step

WORKERS = 2
SEED = 1234
CLUSTER_TIMEOUT_S = 300
BYTES_MODEL = {"features": 512, "units": 1024, "layers": 3, "batch": 16, "steps": 60, "epochs": 1}
DRAIN_S = 0.3
BUSY_LOAD = 0.2  # CPUs of other processes above which a run counts as disturbed
SIZES = ("features", "units", "layers", "batch", "steps", "epochs")


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; the parent forwards the sizes of each part to its children."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("both", "bytes", "steps"), default="both")
    parser.add_argument("--pairs", type=int, default=7, help="A/B pairs of clusters (steps).")
    parser.add_argument("--features", type=int, default=64, help="Input features (steps).")
    parser.add_argument("--units", type=int, default=512, help="Hidden units (steps).")
    parser.add_argument("--layers", type=int, default=2, help="Hidden layers (steps).")
    parser.add_argument("--batch", type=int, default=128, help="Global batch size (steps).")
    parser.add_argument("--steps", type=int, default=100, help="Steps per epoch (steps).")
    parser.add_argument("--epochs", type=int, default=3, help="Timed epochs after 1 warm-up.")
    parser.add_argument(
        "--bytes_steps",
        type=int,
        default=BYTES_MODEL["steps"],
        help="Timed steps of the bytes run.",
    )
    parser.add_argument(
        "--bytes_variant",
        choices=VARIANTS,
        default="hybridpar",
        help="Which training loop the bytes run uses.",
    )
    parser.add_argument(
        "--intra_op_threads",
        type=int,
        default=1,
        help="Threads per op in each worker (0: TensorFlow's default).",
    )
    parser.add_argument(
        "--keep_remainder",
        action="store_true",
        help="batch() without drop_remainder: a dynamic batch dimension, for "
        "which hybridpar adds one scalar all-reduce per step (steps).",
    )
    parser.add_argument(
        "--pin_cpus",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Pin worker i to the i-th CPU in the steps runs (less drift between runs). The "
        "bytes run is never pinned: TCP sends from both CPUs reorder loopback packets and "
        "cause retransmissions.",
    )
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--sample_bytes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "features", "units", "layers", "batch", "steps", "epochs", "bytes_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.intra_op_threads < 0:
        parser.error(f"--intra_op_threads must be >= 0. Received: {args.intra_op_threads}.")
    if args.batch % WORKERS:
        parser.error(f"--batch must be a multiple of {WORKERS}. Received: {args.batch}.")
    return args


def ring_volume(workers: int, gradient_bytes: int) -> int:
    """Bytes all workers together send in one ring all-reduce of ``gradient_bytes``.

    Reduce-scatter and all-gather each take ``n-1`` rounds in which every worker
    sends ``S/n``: ``2(n-1)/n*S`` per worker, ``2(n-1)*S`` in total.
    """
    return 2 * (workers - 1) * gradient_bytes


def loopback_tx(proc_net_dev: str, interface: str = "lo") -> tuple[int, int]:
    """TX bytes and packets of ``interface`` from the text of ``/proc/net/dev``.

    Raises:
        ValueError: if the interface is not listed.
    """
    for line in proc_net_dev.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == interface:
            fields = counters.split()
            return int(fields[8]), int(fields[9])
    raise ValueError(f"No interface {interface!r} in /proc/net/dev. Received: {proc_net_dev!r}")


_SOCKET_LINE = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)")


SocketCounters = dict[tuple[int, int], dict[str, int]]
_COUNTERS = ("bytes_sent", "bytes_retrans")


def socket_counters(ss_output: str, ports: Iterable[int]) -> SocketCounters:
    """``bytes_sent`` and ``bytes_retrans`` per socket (local port, peer port), from ``ss -tinH``.

    Only sockets whose local or peer port is one of ``ports`` count; both
    ends of a localhost connection are listed, so a sum over sockets counts
    what was sent in both directions. ``bytes_sent`` includes retransmissions.
    """
    ports = set(ports)
    counters: SocketCounters = {}
    key = None
    for line in ss_output.splitlines():
        match = _SOCKET_LINE.match(line)
        if match:
            local, peer = int(match.group(2)), int(match.group(4))
            key = (local, peer) if ports & {local, peer} else None
            if key:
                counters[key] = dict.fromkeys(_COUNTERS, 0)
            continue
        for name in _COUNTERS if key else ():
            found = re.search(rf"\b{name}:(\d+)", line)
            if found:
                counters[key][name] = int(found.group(1))
    return counters


def counter_between(before: SocketCounters, after: SocketCounters, name: str) -> int:
    """How much counter ``name`` grew over all sockets (new sockets start at 0)."""
    return sum(c[name] - before.get(key, {}).get(name, 0) for key, c in after.items())


def busy_cpu_seconds(proc_stat: str, ticks_per_second: int) -> float:
    """CPU seconds all CPUs spent busy (not idle or iowait), from ``/proc/stat``."""
    fields = [int(v) for v in proc_stat.splitlines()[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / ticks_per_second


def other_load(busy_s: float, our_cpu_s: float, seconds: float) -> float:
    """CPUs kept busy by everything but our workers during ``seconds`` (0 = idle machine)."""
    return max(0.0, busy_s - our_cpu_s) / seconds


def count_collectives(graph_def: Any) -> dict[str, int]:
    """Collective ops (``Collective*``) in a GraphDef and its function library."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    return dict(collections.Counter(n.op for n in nodes if n.op.startswith("Collective")))


def parse_task_output(stdout: str, task: str) -> dict[str, Any]:
    """The last JSON line that ``task`` (e.g. ``worker:0``) printed through the launcher.

    Raises:
        ValueError: if that task printed no JSON object line.
    """
    prefix = f"[{task}] "
    for line in reversed(stdout.splitlines()):
        body = line.removeprefix(prefix).strip()
        if line.startswith(prefix) and body.startswith("{") and body.endswith("}"):
            return json.loads(body)
    raise ValueError(f"Task {task} printed no JSON result line. Received: {stdout[-800:]!r}")


# --------------------------------------------------------------------------- one worker


def _read(path: str) -> str:
    """The text of a (``/proc``) file."""
    with open(path) as stats:
        return stats.read()


class TimedSection:
    """Samples at the start and end of the timed steps: wall and CPU time, and (on the
    sampling worker) the loopback counters and the cluster sockets' payload."""

    def __init__(self, ports: Sequence[int], wire: bool) -> None:
        self.ports, self.wire = ports, wire
        self.samples: list[dict[str, Any]] = []

    def sample(self) -> None:
        """Takes one sample (the drain wait first when sampling the wire)."""
        if self.wire:  # let the last step's RPC responses leave the socket buffers
            time.sleep(DRAIN_S)
        sample = {
            "time": time.perf_counter(),
            "cpu": sum(os.times()[:2]),
            "busy": busy_cpu_seconds(_read("/proc/stat"), os.sysconf("SC_CLK_TCK")),
        }
        if self.wire:
            sample["lo"] = loopback_tx(_read("/proc/net/dev"))
            try:
                ss = subprocess.run(
                    ["ss", "-tinH"], capture_output=True, text=True, timeout=10
                ).stdout
            except OSError:  # no ss: the payload cross-check reads 0
                ss = ""
            sample["sockets"] = socket_counters(ss, self.ports)
        self.samples.append(sample)

    def result(self) -> dict[str, Any]:
        """Differences between the first and last sample."""
        start, end = self.samples[0], self.samples[-1]
        result = {key: end[key] - start[key] for key in ("time", "cpu", "busy")}
        if self.wire:
            result["lo_tx_bytes"] = end["lo"][0] - start["lo"][0]
            result["lo_tx_packets"] = end["lo"][1] - start["lo"][1]
            for name in _COUNTERS:
                result[name] = counter_between(start["sockets"], end["sockets"], name)
            result["sockets"] = len(end["sockets"])
        return result


def _traced_function(train_function: Any) -> Any:
    """The ``tf.function`` behind ``model.train_function`` (hybridpar's
    ``compat.optional_outputs`` or Keras's own)."""
    import inspect

    nonlocals = inspect.getclosurevars(train_function).nonlocals
    return nonlocals.get("traced") or nonlocals["multi_step_on_iterator"]


def _collectives_of(function: Any) -> dict[str, int]:
    """Collective ops in the (first) traced graph of a ``tf.function``."""
    concrete = function._list_all_concrete_functions()
    return count_collectives(concrete[0].graph.as_graph_def()) if concrete else {}


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Trains as one task of the cluster in TF_CONFIG and returns its timing record."""
    if args.pin_cpus:
        cpus = sorted(os.sched_getaffinity(0))
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})
    import tensorflow as tf

    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.child == "hybridpar":
        import hybridpar  # joins the TF_CONFIG cluster before any op runs

        config = {
            "data_parallel": {"mode": "multi_worker"},
            "data": {"global_batch_size": args.batch, "shard_policy": "data"},
        }
        context = hybridpar.scope(config)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        context = strategy.scope()
    import keras
    import numpy as np

    tf_config = json.loads(os.environ["TF_CONFIG"])
    ports = [int(a.rsplit(":", 1)[1]) for a in tf_config["cluster"]["worker"]]
    section = TimedSection(ports, wire=args.sample_bytes and tf_config["task"]["index"] == 0)
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((max(4096, args.batch), args.features), dtype=np.float32)
    y = rng.integers(0, 10, size=(len(x),), dtype=np.int32)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(args.batch, drop_remainder=not args.keep_remainder)
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
    with context:
        strategy = tf.distribute.get_strategy()
        model = keras.Sequential(
            [keras.Input((args.features,))]
            + [keras.layers.Dense(args.units, activation="relu") for _ in range(args.layers)]
            + [keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.SGD(0.01)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if args.child == "hybridpar":
            model.compile(optimizer=optimizer, loss=loss)
        else:
            optimizer.build(model.trainable_variables)
    step_times: list[float] = []
    if args.child == "hybridpar":
        final_loss, collectives = _fit(model, dataset, args, step_times, section)
    else:
        final_loss, collectives = _custom_loop(
            model, optimizer, strategy, dataset, args, step_times, section
        )
    return {
        "variant": args.child,
        "median_step_s": statistics.median(step_times),
        "mean_step_s": statistics.mean(step_times),
        "steps": len(step_times),
        "final_loss": final_loss,
        "gradient_bytes": sum(
            int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables
        ),
        "params": model.count_params(),
        "workers": strategy.extended._num_workers,
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "collectives": collectives,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "section": section.result(),
    }


def _fit(
    model: Any,
    dataset: Any,
    args: argparse.Namespace,
    step_times: list[float],
    section: TimedSection,
) -> tuple[float, dict[str, int]]:
    """``model.fit`` with a callback that times steps after the warm-up epoch."""
    import keras

    last = args.epochs

    class StepTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch > 0
            if epoch == 1:
                section.sample()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == last:
                section.sample()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                step_times.append(time.perf_counter() - self._start)

    history = model.fit(
        dataset,
        epochs=1 + args.epochs,
        steps_per_epoch=args.steps,
        verbose=0,
        shuffle=False,
        callbacks=[StepTimer()],
    )
    collectives = _collectives_of(_traced_function(model.train_function))
    return float(history.history["loss"][-1]), collectives


def _custom_loop(
    model: Any,
    optimizer: Any,
    strategy: Any,
    dataset: Any,
    args: argparse.Namespace,
    step_times: list[float],
    section: TimedSection,
) -> tuple[float, dict[str, int]]:
    """The standard tf.distribute custom training loop (TF's multi-worker CTL tutorial)."""
    import tensorflow as tf

    train_step = custom_train_step(strategy, model, optimizer, args.batch)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for epoch in range(1 + args.epochs):
        if epoch == 1:
            section.sample()
        losses = []
        for _ in range(args.steps):
            start = time.perf_counter()
            losses.append(train_step(iterator))
            if epoch > 0:
                step_times.append(time.perf_counter() - start)
    section.sample()
    # Like Keras's logged loss: the mean over the last epoch's steps.
    return float(tf.reduce_mean(losses)), _collectives_of(train_step)


# --------------------------------------------------------------------------- the parent


def run_cluster(
    variant: str, sizes: dict[str, int], args: argparse.Namespace, sample_bytes: bool = False
) -> list[dict[str, Any]]:
    """Runs one 2-worker cluster of this script and returns each worker's record.

    Raises:
        RuntimeError: with the cluster's output tail if a worker fails.
    """
    from hybridpar.launch import launch

    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        f"--child={variant}",
        f"--intra_op_threads={args.intra_op_threads}",
        "--pin_cpus" if args.pin_cpus and not sample_bytes else "--no-pin_cpus",
    ]
    cmd += ["--keep_remainder"] if args.keep_remainder and not sample_bytes else []
    cmd += [f"--{name}={sizes[name]}" for name in SIZES]
    cmd += ["--sample_bytes"] if sample_bytes else []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out, err = io.StringIO(), io.StringIO()
    code = launch(cmd, WORKERS, timeout=CLUSTER_TIMEOUT_S, env=env, stdout=out, stderr=err,
                  console="all")  # every worker prints its record
    if code != 0:
        raise RuntimeError(
            f"Cluster --child={variant} exited with {code}:\n"
            f"{out.getvalue()[-2000:]}\n{err.getvalue()[-4000:]}"
        )
    return [parse_task_output(out.getvalue(), f"worker:{i}") for i in range(WORKERS)]


IDLE_WINDOW_S = 2.0


def _idle_loopback(seconds: float = IDLE_WINDOW_S) -> float:
    """Loopback TX bytes per second over an interval with no cluster of ours running."""
    before = loopback_tx(_read("/proc/net/dev"))[0]
    time.sleep(seconds)
    return (loopback_tx(_read("/proc/net/dev"))[0] - before) / seconds


def cluster_load(records: Sequence[dict[str, Any]]) -> float:
    """CPUs used by other processes during a cluster's timed section (worker 0's window)."""
    section = records[0]["section"]
    return other_load(section["busy"], sum(r["section"]["cpu"] for r in records), section["time"])


def _mlp(sizes: dict[str, int] | argparse.Namespace) -> str:
    get = sizes.get if isinstance(sizes, dict) else lambda name: getattr(sizes, name)
    return "-".join([str(get("features"))] + [str(get("units"))] * get("layers") + ["10"])


def bytes_part(args: argparse.Namespace) -> float:
    """Runs the bytes cluster, prints the comparison and returns lo bytes / ring volume."""
    sizes = {**BYTES_MODEL, "steps": args.bytes_steps}
    idle_before = _idle_loopback()
    records = run_cluster(args.bytes_variant, sizes, args, sample_bytes=True)
    idle_after = _idle_loopback()
    rec = records[0]
    wire, steps, workers = rec["section"], rec["steps"], rec["workers"]
    idle = (idle_before + idle_after) / 2 * wire["time"]
    volume = ring_volume(workers, rec["gradient_bytes"])
    per_step = (wire["lo_tx_bytes"] - idle) / steps
    sent, retrans = wire["bytes_sent"] / steps, wire["bytes_retrans"] / steps
    print(
        f"bytes: {args.bytes_variant} ({rec['strategy']}, {workers} workers, "
        f"{rec['replicas']} replicas; TensorFlow {rec['tensorflow']}, Keras {rec['keras']}); "
        f"MLP {_mlp(sizes)} ({rec['params']:,} params), SGD, global batch {sizes['batch']}; "
        f"{steps} timed steps after {sizes['steps']} warm-up steps, {wire['time']:.2f} s, "
        f"other load {cluster_load(records):.2f} CPUs"
    )
    print(
        f"  S (float32 trainable variables) = {rec['gradient_bytes']:,} B; n = {workers}; "
        f"ring all-reduce volume 2(n-1)S = {volume:,} B per step, all workers together "
        f"(2(n-1)/n*S = {volume // workers:,} B sent by each)"
    )
    print(
        f"  loopback TX (/proc/net/dev lo, all workers): {per_step:,.0f} B/step, "
        f"{wire['lo_tx_packets'] / steps:.1f} packets/step; idle baseline "
        f"{idle_before:,.0f}/{idle_after:,.0f} B/s before/after, {idle:,.0f} B subtracted "
        f"-> ratio {per_step / volume:.4f}"
    )
    print(
        f"  TCP payload of the cluster's {wire['sockets']} sockets (ss -ti, needs no "
        f"baseline): {sent:,.0f} B/step -> ratio {sent / volume:.4f}; without TCP "
        f"retransmissions {sent - retrans:,.0f} B/step -> ratio {(sent - retrans) / volume:.4f}"
    )
    print(
        f"  beyond 2(n-1)S on loopback: {per_step - volume:,.0f} B/step = "
        f"{sent - retrans - volume:,.0f} gRPC/HTTP2 framing, RPC requests, loss all-reduce, "
        f"coordination + {retrans:,.0f} TCP retransmissions + ~{per_step - sent:,.0f} TCP/IP "
        "headers and ACKs"
    )
    print(f"  collective ops in the traced train function: {rec['collectives']}")
    return per_step / volume


def steps_part(args: argparse.Namespace) -> float:
    """Runs the interleaved A/B clusters, prints the comparison, returns hybridpar/raw."""
    sizes = {name: getattr(args, name) for name in SIZES}
    medians: list[dict[str, float]] = []
    first: dict[str, dict[str, Any]] = {}
    disturbed: list[int] = []
    for i, order in enumerate(pair_orders(args.pairs)):
        runs = {variant: run_cluster(variant, sizes, args) for variant in order}
        loads = {variant: cluster_load(records) for variant, records in runs.items()}
        if max(loads.values()) > BUSY_LOAD:
            disturbed.append(i + 1)
        for variant, records in runs.items():
            first.setdefault(variant, records[0])
        # A step ends on both workers together; the slower worker's median is the cluster's.
        medians.append({v: max(r["median_step_s"] for r in runs[v]) for v in VARIANTS})
        hyb, raw = runs["hybridpar"][0], runs["raw"][0]
        print(
            f"pair {i + 1}/{args.pairs} (first: {order[0]:9s}) median step "
            f"hybridpar={medians[-1]['hybridpar'] * 1e3:.3f} ms "
            f"raw={medians[-1]['raw'] * 1e3:.3f} ms "
            f"(mean {hyb['mean_step_s'] * 1e3:.3f}/{raw['mean_step_s'] * 1e3:.3f} ms) "
            f"final loss {hyb['final_loss']:.6f}/{raw['final_loss']:.6f}; other load "
            f"{loads['hybridpar']:.2f}/{loads['raw']:.2f} CPUs",
            flush=True,
        )
    rec = first["raw"]
    print(
        f"steps: TensorFlow {rec['tensorflow']}, Keras {rec['keras']}; MLP {_mlp(args)} "
        f"({rec['params']:,} params, S = {rec['gradient_bytes']:,} B), SGD; data "
        f"4096x{args.features} in memory, repeated; global batch {args.batch} "
        f"({'dynamic shape' if args.keep_remainder else 'drop_remainder'}, DATA sharding); "
        f"intra-op threads "
        f"{args.intra_op_threads or 'TF default'}; workers "
        f"{'pinned to one CPU each' if args.pin_cpus else 'not pinned'}; 1 warm-up + "
        f"{args.epochs} timed epochs of {args.steps} steps ({rec['steps']} timed "
        f"steps/worker); {args.pairs} pairs, {2 * args.pairs} clusters of {WORKERS} workers"
    )
    for variant in VARIANTS:
        desc = (
            "model.fit under hybridpar.scope(mode=multi_worker)"
            if variant == "hybridpar"
            else "tf.function CTL: strategy.run + compute_average_loss + reduce(SUM)"
        )
        print(
            f"  {variant:9s}: {desc}; {first[variant]['strategy']}, "
            f"collective ops per step {first[variant]['collectives']}"
        )
    if disturbed:
        print(
            f"  WARNING: pairs {disturbed} ran beside other processes using > {BUSY_LOAD} "
            "CPUs; the median over pairs tolerates a few, but rerun on an idle machine."
        )
    hybrid, raw, ratio = summarize(medians)
    per_pair = statistics.median(p["hybridpar"] / p["raw"] for p in medians)
    print(
        f"median step over pairs: hybridpar={hybrid * 1e3:.3f} ms raw={raw * 1e3:.3f} ms "
        f"(median of the per-pair ratios {per_pair:.3f}; target ratio <= 1.02, not asserted)"
    )
    return ratio


def run_parent(args: argparse.Namespace) -> None:
    """Runs the requested parts; the last two lines are the bytes and step ratios."""
    start = time.perf_counter()
    print(
        f"hybridpar multi-worker benchmark: {WORKERS} worker processes per cluster on "
        f"localhost (hybridpar.launch.launch), {os.cpu_count()} CPUs",
        flush=True,
    )
    bytes_ratio = bytes_part(args) if args.part in ("both", "bytes") else math.nan
    step_ratio = steps_part(args) if args.part in ("both", "steps") else math.nan
    print(f"wall time {time.perf_counter() - start:.0f} s")
    print(f"bytes_ratio={bytes_ratio:.3f}")
    print(f"step_ratio={step_ratio:.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: the parent by default, one cluster task with ``--child``."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_worker(args)), flush=True)
    else:
        os.environ.pop("TF_CONFIG", None)  # the parent must not join a cluster (import hybridpar)
        run_parent(args)


if __name__ == "__main__":
    main()

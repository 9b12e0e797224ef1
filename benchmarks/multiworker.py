"""Multi-worker figures on a real 2-worker localhost cluster: wire bytes and step time.

(a) ``bytes``: one cluster trains a ~10 MB MLP with ``model.fit`` under
``hybridpar.scope`` (``data_parallel.mode: multi_worker``). Worker 0 reads the
loopback TX counter of ``/proc/net/dev`` (and, as a cross-check, the TCP
payload of the cluster's own sockets from ``ss``) at the start and end of the
timed epochs. The total bytes both workers sent per step are divided by the
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

    python benchmarks/multiworker.py [--part both|bytes|steps] [--pairs 3]
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

VARIANTS = ("hybridpar", "raw")
WORKERS = 2
SEED = 1234
CLUSTER_TIMEOUT_S = 300
BYTES_MODEL = {"features": 512, "units": 1024, "layers": 3, "batch": 16, "steps": 40, "epochs": 1}
SIZES = ("features", "units", "layers", "batch", "steps", "epochs")


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; the parent forwards the sizes of each part to its children."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("both", "bytes", "steps"), default="both")
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs of clusters (steps).")
    parser.add_argument("--features", type=int, default=64, help="Input features (steps).")
    parser.add_argument("--units", type=int, default=512, help="Hidden units (steps).")
    parser.add_argument("--layers", type=int, default=2, help="Hidden layers (steps).")
    parser.add_argument("--batch", type=int, default=128, help="Global batch size (steps).")
    parser.add_argument("--steps", type=int, default=100, help="Steps per epoch (steps).")
    parser.add_argument("--epochs", type=int, default=3, help="Timed epochs after 1 warm-up.")
    parser.add_argument("--bytes_steps", type=int, default=BYTES_MODEL["steps"],
                        help="Timed steps of the bytes run.")
    parser.add_argument("--bytes_variant", choices=VARIANTS, default="hybridpar",
                        help="Which training loop the bytes run uses.")
    parser.add_argument("--intra_op_threads", type=int, default=1,
                        help="Threads per op in each worker (0: TensorFlow's default).")
    parser.add_argument("--pin_cpus", action=argparse.BooleanOptionalAction, default=True,
                        help="Pin worker i to the i-th CPU (needs >= 2 CPUs).")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--sample_bytes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "features", "units", "layers", "batch", "steps", "epochs",
                 "bytes_steps"):
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


def socket_bytes_sent(ss_output: str, ports: Iterable[int]) -> dict[tuple[int, int], int]:
    """TCP payload sent per socket (local port, peer port), from ``ss -tinH``.

    Only sockets whose local or peer port is one of ``ports`` count; both
    ends of a localhost connection are listed, so the sum over sockets is
    the payload sent in both directions.
    """
    ports = set(ports)
    sent: dict[tuple[int, int], int] = {}
    key = None
    for line in ss_output.splitlines():
        match = _SOCKET_LINE.match(line)
        if match:
            local, peer = int(match.group(2)), int(match.group(4))
            key = (local, peer) if ports & {local, peer} else None
            if key:
                sent[key] = 0
            continue
        found = re.search(r"\bbytes_sent:(\d+)", line)
        if key and found:
            sent[key] = int(found.group(1))
    return sent


def bytes_between(before: dict[tuple[int, int], int], after: dict[tuple[int, int], int]) -> int:
    """Payload sent between two ``socket_bytes_sent`` samples (new sockets start at 0)."""
    return sum(value - before.get(key, 0) for key, value in after.items())


def count_collectives(graph_def: Any) -> dict[str, int]:
    """Collective ops (``Collective*``) in a GraphDef and its function library."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    return dict(collections.Counter(n.op for n in nodes if n.op.startswith("Collective")))


def pair_orders(pairs: int) -> list[tuple[str, str]]:
    """Run order per pair: ``hybridpar`` first in even pairs, ``raw`` first in odd ones."""
    return [VARIANTS if i % 2 == 0 else VARIANTS[::-1] for i in range(pairs)]


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


def summarize(pairs: Sequence[dict[str, float]]) -> tuple[float, float, float]:
    """Median over pairs of each variant's step time, and their ratio hybridpar/raw."""
    hybrid = statistics.median(p["hybridpar"] for p in pairs)
    raw = statistics.median(p["raw"] for p in pairs)
    return hybrid, raw, hybrid / raw


# --------------------------------------------------------------------------- one worker


def _sample_wire(ports: Sequence[int]) -> dict[str, Any]:
    """Loopback TX counters and the cluster sockets' payload, right now."""
    with open("/proc/net/dev") as stats:
        tx_bytes, tx_packets = loopback_tx(stats.read())
    try:
        ss = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        ss = ""
    return {"time": time.perf_counter(), "tx_bytes": tx_bytes, "tx_packets": tx_packets,
            "sockets": socket_bytes_sent(ss, ports)}


def _wire_delta(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    return {
        "seconds": end["time"] - start["time"],
        "lo_tx_bytes": end["tx_bytes"] - start["tx_bytes"],
        "lo_tx_packets": end["tx_packets"] - start["tx_packets"],
        "socket_payload_bytes": bytes_between(start["sockets"], end["sockets"]),
        "sockets": len(end["sockets"]),
    }


def _traced_function(train_function: Any) -> Any:
    """The ``tf.function`` behind Keras's ``model.train_function`` wrapper."""
    import inspect

    return inspect.getclosurevars(train_function).nonlocals["multi_step_on_iterator"]


def _collectives_of(function: Any) -> dict[str, int]:
    concrete = function._list_all_concrete_functions()
    return count_collectives(concrete[0].graph.as_graph_def()) if concrete else {}


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Trains as one task of the cluster in TF_CONFIG and returns its timing record."""
    if args.pin_cpus:
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[index % WORKERS]})
    import tensorflow as tf

    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.child == "hybridpar":
        import hybridpar  # joins the TF_CONFIG cluster before any op runs

        config = {"data_parallel": {"mode": "multi_worker"},
                  "data": {"global_batch_size": args.batch, "shard_policy": "data"}}
        context = hybridpar.scope(config)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        context = strategy.scope()
    import keras
    import numpy as np

    tf_config = json.loads(os.environ["TF_CONFIG"])
    ports = [int(a.rsplit(":", 1)[1]) for a in tf_config["cluster"]["worker"]]
    is_sampler = args.sample_bytes and tf_config["task"]["index"] == 0
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((max(4096, args.batch), args.features), dtype=np.float32)
    y = rng.integers(0, 10, size=(len(x),), dtype=np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        args.batch, drop_remainder=True)
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
    wire: list[dict[str, Any]] = []
    if args.child == "hybridpar":
        final_loss, collectives = _fit(model, dataset, args, step_times, wire, ports, is_sampler)
    else:
        final_loss, collectives = _custom_loop(
            model, optimizer, strategy, dataset, args, step_times, wire, ports, is_sampler)
    record: dict[str, Any] = {
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
    }
    if is_sampler:
        record["wire"] = _wire_delta(*wire)
    return record


def _fit(model, dataset, args, step_times, wire, ports, is_sampler) -> tuple[float, dict]:
    """``model.fit`` with a callback that times steps after the warm-up epoch."""
    import keras

    last = args.epochs

    class StepTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch > 0
            if epoch == 1 and is_sampler:
                wire.append(_sample_wire(ports))

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == last and is_sampler:
                wire.append(_sample_wire(ports))

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                step_times.append(time.perf_counter() - self._start)

    history = model.fit(dataset, epochs=1 + args.epochs, steps_per_epoch=args.steps,
                        verbose=0, callbacks=[StepTimer()])
    collectives = _collectives_of(_traced_function(model.train_function))
    return float(history.history["loss"][-1]), collectives


def _custom_loop(model, optimizer, strategy, dataset, args, step_times, wire, ports,
                 is_sampler) -> tuple[float, dict]:
    """The standard tf.distribute custom training loop (TF's multi-worker CTL tutorial)."""
    import keras
    import tensorflow as tf

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                per_example(y, model(x, training=True)), global_batch_size=args.batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator):
        per_replica = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for epoch in range(1 + args.epochs):
        if epoch == 1 and is_sampler:
            wire.append(_sample_wire(ports))
        losses = []
        for _ in range(args.steps):
            start = time.perf_counter()
            losses.append(train_step(iterator))
            if epoch > 0:
                step_times.append(time.perf_counter() - start)
    if is_sampler:
        wire.append(_sample_wire(ports))
    # Like Keras's logged loss: the mean over the last epoch's steps.
    return float(tf.reduce_mean(losses)), _collectives_of(train_step)


# --------------------------------------------------------------------------- the parent


def run_cluster(variant: str, sizes: dict[str, int], args: argparse.Namespace,
                sample_bytes: bool = False) -> list[dict[str, Any]]:
    """Runs one 2-worker cluster of this script and returns each worker's record.

    Raises:
        RuntimeError: with the cluster's output tail if a worker fails.
    """
    from hybridpar.launch import launch

    cmd = [sys.executable, os.path.abspath(__file__), f"--child={variant}",
           f"--intra_op_threads={args.intra_op_threads}",
           "--pin_cpus" if args.pin_cpus else "--no-pin_cpus"]
    cmd += [f"--{name}={sizes[name]}" for name in SIZES]
    cmd += ["--sample_bytes"] if sample_bytes else []
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    out, err = io.StringIO(), io.StringIO()
    code = launch(cmd, WORKERS, timeout=CLUSTER_TIMEOUT_S, env=env, stdout=out, stderr=err)
    if code != 0:
        raise RuntimeError(f"Cluster --child={variant} exited with {code}:\n"
                           f"{out.getvalue()[-2000:]}\n{err.getvalue()[-4000:]}")
    return [parse_task_output(out.getvalue(), f"worker:{i}") for i in range(WORKERS)]


IDLE_WINDOW_S = 2.0


def _loopback_now() -> int:
    with open("/proc/net/dev") as stats:
        return loopback_tx(stats.read())[0]


def _idle_loopback(seconds: float = IDLE_WINDOW_S) -> float:
    """Loopback TX bytes per second over an interval with no cluster of ours running."""
    before = _loopback_now()
    time.sleep(seconds)
    return (_loopback_now() - before) / seconds


def bytes_part(args: argparse.Namespace) -> float:
    """Runs the bytes cluster, prints the comparison and returns lo bytes / ring volume."""
    sizes = {**BYTES_MODEL, "steps": args.bytes_steps}
    idle_before = _idle_loopback()
    rec = run_cluster(args.bytes_variant, sizes, args, sample_bytes=True)[0]
    idle_after = _idle_loopback()
    wire, steps, workers = rec["wire"], rec["steps"], rec["workers"]
    idle = (idle_before + idle_after) / 2 * wire["seconds"]
    gradient_bytes = rec["gradient_bytes"]
    volume = ring_volume(workers, gradient_bytes)
    per_step = (wire["lo_tx_bytes"] - idle) / steps
    payload = wire["socket_payload_bytes"] / steps
    layers = "-".join([str(sizes["features"])] + [str(sizes["units"])] * sizes["layers"] + ["10"])
    print(f"bytes: {args.bytes_variant} ({rec['strategy']}, {workers} workers, "
          f"{rec['replicas']} replicas; TensorFlow {rec['tensorflow']}, Keras {rec['keras']}), "
          f"MLP {layers} ({rec['params']:,} params), SGD, global batch {sizes['batch']}; "
          f"{steps} timed steps after {sizes['steps']} warm-up steps, {wire['seconds']:.2f} s")
    print(f"  S (float32 trainable variables) = {gradient_bytes:,} B; n = {workers}; ring "
          f"all-reduce volume 2(n-1)S = {volume:,} B per step, all workers together "
          f"(2(n-1)/n*S = {volume // workers:,} B sent by each)")
    print(f"  loopback TX (/proc/net/dev lo, all workers): {per_step:,.0f} B/step, "
          f"{wire['lo_tx_packets'] / steps:.1f} packets/step; idle baseline "
          f"{idle_before:,.0f}/{idle_after:,.0f} B/s before/after, {idle:,.0f} B subtracted "
          f"-> ratio {per_step / volume:.4f}")
    print(f"  TCP payload of the cluster's {wire['sockets']} sockets (ss -ti, no baseline "
          f"needed): {payload:,.0f} B/step -> ratio {payload / volume:.4f}")
    print(f"  beyond 2(n-1)S: {per_step - volume:,.0f} B/step on loopback = "
          f"{payload - volume:,.0f} B payload (gRPC/HTTP2 framing, RPC requests, the loss "
          f"all-reduce, coordination) + ~{per_step - payload:,.0f} B TCP/IP headers")
    print(f"  collective ops in the traced train function: {rec['collectives']}")
    return per_step / volume


def steps_part(args: argparse.Namespace) -> float:
    """Runs the interleaved A/B clusters, prints the comparison, returns hybridpar/raw."""
    sizes = {name: getattr(args, name) for name in SIZES}
    medians: list[dict[str, float]] = []
    first: dict[str, dict[str, Any]] = {}
    for i, order in enumerate(pair_orders(args.pairs)):
        runs = {variant: run_cluster(variant, sizes, args) for variant in order}
        for variant, records in runs.items():
            first.setdefault(variant, records[0])
        # A step ends on both workers together; the slower worker's median is the cluster's.
        medians.append({v: max(r["median_step_s"] for r in runs[v]) for v in VARIANTS})
        hyb, raw = runs["hybridpar"][0], runs["raw"][0]
        print(f"pair {i + 1}/{args.pairs} (first: {order[0]:9s}) median step "
              f"hybridpar={medians[-1]['hybridpar'] * 1e3:.3f} ms "
              f"raw={medians[-1]['raw'] * 1e3:.3f} ms "
              f"(mean {hyb['mean_step_s'] * 1e3:.3f}/{raw['mean_step_s'] * 1e3:.3f} ms) "
              f"final loss {hyb['final_loss']:.6f}/{raw['final_loss']:.6f}", flush=True)
    rec = first["raw"]
    layers = "-".join([str(args.features)] + [str(args.units)] * args.layers + ["10"])
    print(f"steps: TensorFlow {rec['tensorflow']}, Keras {rec['keras']}; MLP {layers} "
          f"({rec['params']:,} params, S = {rec['gradient_bytes']:,} B), "
          f"SGD; data 4096x{args.features} in memory, repeated; global batch {args.batch} "
          f"(drop_remainder, DATA sharding); intra-op threads "
          f"{args.intra_op_threads or 'TF default'}; 1 warm-up + {args.epochs} timed epochs of "
          f"{args.steps} steps ({rec['steps']} timed steps/worker); {args.pairs} pairs, "
          f"{2 * args.pairs} clusters of {WORKERS} workers")
    for variant in VARIANTS:
        desc = ("model.fit under hybridpar.scope(mode=multi_worker)" if variant == "hybridpar"
                else "tf.function CTL: strategy.run + compute_average_loss + reduce(SUM)")
        print(f"  {variant:9s}: {desc}; {first[variant]['strategy']}, "
              f"collectives per step {first[variant]['collectives']}")
    hybrid, raw, ratio = summarize(medians)
    print(f"median step over pairs: hybridpar={hybrid * 1e3:.3f} ms raw={raw * 1e3:.3f} ms "
          f"(target ratio <= 1.05, not asserted)")
    return ratio


def run_parent(args: argparse.Namespace) -> None:
    """Runs the requested parts; the last two lines are the bytes and step ratios."""
    start = time.perf_counter()
    print(f"hybridpar multi-worker benchmark: {WORKERS} worker processes per cluster on "
          f"localhost (hybridpar.launch.launch), {os.cpu_count()} CPUs", flush=True)
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
        run_parent(args)


if __name__ == "__main__":
    main()

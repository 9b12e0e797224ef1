"""Gradient compression on a real 2-worker cluster: bytes per step, step time, accuracy.

Every run is a cluster of two worker processes (this script re-invoked with
``--child``), each training the same seeded MLP 64-1024-1024-1024-10 (S =
8.7 MB of float32 gradients) with ``model.fit`` under ``hybridpar.scope``
(``data_parallel.mode: multi_worker``, SGD with momentum, global batch 64) on
``hybridpar_digits`` for a fixed number of epochs, with
``communication.compression`` none, fp16, bf16 and PowerSGD rank 1, 4 and 16.
The first epoch is a warm-up; the others are timed. Per variant:

- bytes per step on the wire during the timed epochs, divided by the
  uncompressed run's, beside the analytic ratio (``compression_plan``: what
  each replica puts into the all-reduce);
- the median step time, divided by the uncompressed run's of the same round;
- test accuracy after the last epoch, and its difference to uncompressed.

Networks (``--network``):

- ``loopback``: both workers on localhost (``hybridpar.launch.launch``); bytes
  are the TCP payload of the cluster's own sockets (``ss -ti``, both ends,
  retransmissions excluded), so other traffic on ``lo`` does not count.
- ``netns``: two network namespaces joined by a veth pair whose both ends are
  shaped by ``tc`` (token bucket) to ``--bandwidth``; bytes are what the two
  veth ends transmitted (headers included). It needs root and ``ip``/``tc``
  (iproute2); where they are missing it is skipped with a message.

Variants run in rounds whose order rotates, so each ratio compares runs made
side by side. The last lines are ``fp16_bytes_ratio=``, ``powersgd_bytes_ratio=``
(rank 4) and ``powersgd_accuracy_delta=`` (rank 4 minus uncompressed), from the
first network run.

    python benchmarks/compression.py [--network both|loopback|netns] [--rounds 2]
        [--epochs 5] [--bandwidth 1gbit]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from multiworker import counter_between, loopback_tx, parse_task_output, socket_counters

WORKERS = 2
SEED = 1234
UNITS, LAYERS = 1024, 3
VARIANTS = ("none", "fp16", "bf16", "powersgd-1", "powersgd-4", "powersgd-16")
CLUSTER_TIMEOUT_S = 600
NETNS_PORT = 29500
NETNS_SUBNET = "10.77.0"  # private to the two namespaces, so it collides with nothing


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=("both", "loopback", "netns"), default="both")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of all variants.")
    parser.add_argument("--epochs", type=int, default=5, help="Epochs (the first untimed).")
    parser.add_argument("--batch", type=int, default=64, help="Global batch size.")
    parser.add_argument("--learning_rate", type=float, default=0.02)
    parser.add_argument("--bandwidth", default="1gbit", help="tc rate of the netns link.")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="Comma-separated subset of " + ",".join(VARIANTS) + ".")
    parser.add_argument("--intra_op_threads", type=int, default=1)
    parser.add_argument("--data_dir", default=None, help="tfds dir (default: a temporary one).")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--wire", default="ss", help=argparse.SUPPRESS)  # ss | an interface
    args = parser.parse_args(argv)
    for name in ("rounds", "epochs", "batch", "intra_op_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2 (one warm-up, then timed). Received: {args.epochs}.")
    args.variants = tuple(v for v in args.variants.split(",") if v)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or "none" not in args.variants:
        parser.error(f"--variants must include 'none' and name only {', '.join(VARIANTS)}. "
                     f"Received: {','.join(args.variants)}.")
    try:
        bandwidth_bits(args.bandwidth)
    except ValueError as err:
        parser.error(str(err))
    return args


def communication(variant: str) -> dict[str, Any]:
    """The ``communication`` config section of a variant (``powersgd-4``: rank 4)."""
    if not variant.startswith("powersgd-"):
        return {"compression": variant}
    return {"compression": "powersgd", "powersgd": {"rank": int(variant.split("-")[1])}}


def round_orders(variants: Sequence[str], rounds: int) -> list[list[str]]:
    """The run order of each round: the variants rotated by one more each round."""
    return [list(variants[i % len(variants):]) + list(variants[:i % len(variants)])
            for i in range(rounds)]


def bandwidth_bits(text: str) -> int:
    """Bits per second of a tc rate such as ``1gbit``, ``500mbit``, ``100kbit``.

    Raises:
        ValueError: for anything else.
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text.strip().lower())
    if not match:
        raise ValueError(
            f"--bandwidth must be a tc rate like 1gbit or 500mbit. Received: {text!r}.")
    return int(float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2]])


def tbf_burst(bits_per_second: int) -> int:
    """Token-bucket burst bytes: 10 ms at the rate, at least 32 KB (tc needs rate/HZ)."""
    return max(32 * 1024, bits_per_second // 8 // 100)


def cluster_step(records: Sequence[dict[str, Any]]) -> float:
    """A cluster's step time: the slower worker's median (a step ends on both together)."""
    return max(r["median_step_s"] for r in records)


def wire_bytes(records: Sequence[dict[str, Any]]) -> float:
    """Bytes per timed step both workers sent (each worker reports what its sampler saw)."""
    return sum(r["wire_bytes"] for r in records) / records[0]["steps"]


def summarize(rounds: Sequence[dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, float]]:
    """Per variant: bytes ratio, step ratio (medians over rounds, each round's own
    uncompressed run as the reference), analytic ratio, accuracy and its delta."""
    table = {}
    base_accuracy = rounds[0]["none"][0]["accuracy"]
    for variant in rounds[0]:
        first = rounds[0][variant][0]
        table[variant] = {
            "analytic": first["analytic_ratio"],
            "bytes_per_step": statistics.median(wire_bytes(r[variant]) for r in rounds),
            "bytes_ratio": statistics.median(
                wire_bytes(r[variant]) / wire_bytes(r["none"]) for r in rounds),
            "step_s": statistics.median(cluster_step(r[variant]) for r in rounds),
            "step_ratio": statistics.median(
                cluster_step(r[variant]) / cluster_step(r["none"]) for r in rounds),
            "accuracy": first["accuracy"],
            "accuracy_delta": first["accuracy"] - base_accuracy,
            "accuracy_stable": all(r[variant][0]["accuracy"] == first["accuracy"]
                                   for r in rounds),
        }
    return table


# --------------------------------------------------------------------------- one worker


def _read(path: str) -> str:
    with open(path) as stats:
        return stats.read()


class Wire:
    """Bytes this worker's sampler sees leave: the cluster sockets' TCP payload (``ss``,
    worker 0 only, both ends of every connection) or one interface's TX counter."""

    def __init__(self, how: str, ports: Sequence[int], index: int) -> None:
        self.how, self.ports = how, ports
        self.active = how != "ss" or index == 0
        self.start: Any = None
        self.total = 0

    def _sample(self) -> Any:
        if self.how != "ss":
            return loopback_tx(_read("/proc/net/dev"), self.how)[0]
        output = subprocess.run(["ss", "-tinH"], capture_output=True, text=True,
                                timeout=10).stdout
        return socket_counters(output, self.ports)

    def begin(self) -> None:
        if self.active:
            time.sleep(0.3)  # let the previous step's RPC responses leave the buffers
            self.start = self._sample()

    def end(self) -> None:
        if not self.active:
            return
        time.sleep(0.3)
        end = self._sample()
        if self.how != "ss":
            self.total = end - self.start
        else:
            self.total = (counter_between(self.start, end, "bytes_sent")
                          - counter_between(self.start, end, "bytes_retrans"))


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Trains as one task of the cluster in TF_CONFIG and returns its record."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    import hybridpar  # joins the TF_CONFIG cluster before any op runs

    tf_config = json.loads(os.environ["TF_CONFIG"])
    import keras

    ports = [int(a.rsplit(":", 1)[1]) for a in tf_config["cluster"]["worker"]]
    wire = Wire(args.wire, ports, tf_config["task"]["index"])
    config = {"data_parallel": {"mode": "multi_worker"},
              "data": {"global_batch_size": args.batch, "shard_policy": "data"},
              "communication": {"timeout_seconds": 300, **communication(args.child)}}
    keras.utils.set_random_seed(SEED)

    def digits(split: str, training: bool) -> tf.data.Dataset:
        data = hybridpar.data.load_tfds("hybridpar_digits", split, args.data_dir,
                                        as_supervised=True).cache()
        if training:
            data = data.shuffle(2048, seed=SEED)
        return data.batch(args.batch, drop_remainder=training)

    with hybridpar.scope(config) as hs:
        model = keras.Sequential(
            [keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten()]
            + [keras.layers.Dense(UNITS, activation="relu") for _ in range(LAYERS)]
            + [keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(args.learning_rate, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    step_times: list[float] = []
    last = args.epochs - 1

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch >= 1
            if epoch == 1:
                wire.begin()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == last:
                wire.end()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                step_times.append(time.perf_counter() - self._start)

    history = model.fit(digits("train", True), epochs=args.epochs, verbose=0,
                        callbacks=[Timer()])
    evaluation = model.evaluate(digits("test", False), verbose=0, return_dict=True)
    report = hs.state.compression.report if hs.state.compression else None
    return {
        "variant": args.child,
        "median_step_s": statistics.median(step_times),
        "steps": len(step_times),
        "wire_bytes": wire.total,
        "analytic_ratio": report.ratio if report else 1.0,
        "report": report.summary() if report else "uncompressed",
        "gradient_bytes": sum(math.prod(v.shape) * 4 for v in model.trainable_variables),
        "accuracy": float(evaluation["accuracy"]),
        "loss": float(history.history["loss"][-1]),
        "replicas": hs.num_replicas,
    }


# --------------------------------------------------------------------------- clusters


def child_command(variant: str, args: argparse.Namespace, wire: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), f"--child={variant}", f"--wire={wire}",
            f"--epochs={args.epochs}", f"--batch={args.batch}",
            f"--learning_rate={args.learning_rate}", f"--data_dir={args.data_dir}",
            f"--intra_op_threads={args.intra_op_threads}"]


def run_loopback(variant: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One cluster on localhost through ``hybridpar.launch.launch``."""
    import io

    from hybridpar.launch import launch

    out, err = io.StringIO(), io.StringIO()
    code = launch(child_command(variant, args, "ss"), WORKERS, timeout=CLUSTER_TIMEOUT_S,
                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=out, stderr=err,
                  console="all")  # every worker prints its record
    if code != 0:
        raise RuntimeError(f"cluster {variant} exited with {code}:\n{err.getvalue()[-4000:]}")
    return [parse_task_output(out.getvalue(), f"worker:{i}") for i in range(WORKERS)]


class ShapedLink:
    """Two network namespaces joined by a veth pair, each end shaped by tc to a rate."""

    def __init__(self, bandwidth: str) -> None:
        tag = f"{os.getpid() % 100000}"
        self.namespaces = [f"hpc{tag}a", f"hpc{tag}b"]
        self.interfaces = [f"hpv{tag}a", f"hpv{tag}b"]
        self.addresses = [f"{NETNS_SUBNET}.{i + 1}" for i in range(WORKERS)]
        self.bandwidth = bandwidth

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or ``None``."""
        if os.geteuid() != 0:
            return "it needs root (network namespaces and tc)"
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        return f"{' and '.join(missing)} not found (install iproute2)" if missing else None

    def __enter__(self) -> ShapedLink:
        burst = tbf_burst(bandwidth_bits(self.bandwidth))
        (a, b), (va, vb) = self.namespaces, self.interfaces
        commands = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
                    ["ip", "link", "add", va, "type", "veth", "peer", "name", vb],
                    ["ip", "link", "set", va, "netns", a], ["ip", "link", "set", vb, "netns", b]]
        for ns, dev, address in zip(self.namespaces, self.interfaces, self.addresses,
                                    strict=True):
            commands += [["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev],
                         ["ip", "-n", ns, "link", "set", dev, "up"],
                         ["ip", "-n", ns, "link", "set", "lo", "up"],
                         ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                          self.bandwidth, "burst", str(burst), "latency", "50ms"]]
        try:
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as err:
            self.__exit__()
            raise RuntimeError(f"{' '.join(err.cmd)} failed: {err.stderr.strip()}") from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        for ns in self.namespaces:  # deleting a namespace deletes its end of the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def run(self, variant: str, args: argparse.Namespace) -> list[dict[str, Any]]:
        """One cluster, worker i in namespace i."""
        from hybridpar.launch.tasks import make_tf_config

        cluster = {"worker": [f"{a}:{NETNS_PORT}" for a in self.addresses]}
        with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stack:
            procs = []
            for i, (ns, dev) in enumerate(zip(self.namespaces, self.interfaces, strict=True)):
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                       "TF_CONFIG": json.dumps(make_tf_config(cluster, "worker", i))}
                out = stack.enter_context(open(os.path.join(logs, f"{i}.out"), "w+"))
                err = stack.enter_context(open(os.path.join(logs, f"{i}.err"), "w+"))
                procs.append((subprocess.Popen(
                    ["ip", "netns", "exec", ns, *child_command(variant, args, dev)],
                    stdout=out, stderr=err, env=env, start_new_session=True), out, err))
            records = [_finish(proc, out, err, i) for i, (proc, out, err) in enumerate(procs)]
        return records


def _finish(proc: subprocess.Popen, out: Any, err: Any, index: int) -> dict[str, Any]:
    try:
        code = proc.wait(timeout=CLUSTER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        code = proc.wait()
    out.seek(0)
    err.seek(0)
    if code != 0:
        raise RuntimeError(f"netns worker {index} exited with {code}:\n{err.read()[-4000:]}")
    lines = [line for line in out.read().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- the parent


def run_network(name: str, runner: Any, args: argparse.Namespace) -> dict[str, dict]:
    """All rounds on one network; prints each cluster and the table, returns the table."""
    rounds = []
    for number, order in enumerate(round_orders(args.variants, args.rounds), start=1):
        results = {}
        for variant in order:
            records = runner(variant, args)
            results[variant] = records
            print(f"[{name}] round {number}/{args.rounds} {variant:12s} step "
                  f"{cluster_step(records) * 1e3:8.2f} ms, {wire_bytes(records):13,.0f} B/step, "
                  f"accuracy {records[0]['accuracy']:.4f}", flush=True)
        rounds.append({v: results[v] for v in args.variants})
    table = summarize(rounds)
    none = rounds[0]["none"][0]
    print(f"[{name}] {none['replicas']} replicas; S = {none['gradient_bytes']:,} B of float32 "
          f"gradients; uncompressed wire bytes per step {table['none']['bytes_per_step']:,.0f} "
          f"(ring volume 2(n-1)S = {2 * (WORKERS - 1) * none['gradient_bytes']:,})")
    print(f"[{name}] {'variant':12s} {'analytic':>9s} {'bytes':>8s} {'B/step':>12s} "
          f"{'step ms':>8s} {'step':>6s} {'accuracy':>9s} {'delta':>7s}")
    for variant, row in table.items():
        stable = "" if row["accuracy_stable"] else " (differs between rounds)"
        print(f"[{name}] {variant:12s} {row['analytic']:9.4f} {row['bytes_ratio']:8.4f} "
              f"{row['bytes_per_step']:12,.0f} {row['step_s'] * 1e3:8.2f} "
              f"{row['step_ratio']:6.3f} {row['accuracy']:9.4f} "
              f"{row['accuracy_delta']:+7.4f}{stable}")
    for variant in args.variants[1:]:
        print(f"[{name}]   {variant}: {rounds[0][variant][0]['report']}")
    return table


def run_parent(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    print(f"hybridpar compression benchmark: {WORKERS} workers, MLP 64-"
          f"{'-'.join([str(UNITS)] * LAYERS)}-10, SGD(momentum 0.9, lr {args.learning_rate}), "
          f"global batch {args.batch}, {args.epochs} epochs of hybridpar_digits (1 warm-up), "
          f"{args.rounds} round(s), intra-op threads {args.intra_op_threads}, "
          f"{os.cpu_count()} CPUs", flush=True)
    with contextlib.ExitStack() as stack:
        if args.data_dir is None:
            args.data_dir = stack.enter_context(tempfile.TemporaryDirectory())
        import hybridpar.data  # prepares the embedded data set once, before the workers read it

        hybridpar.data.load_tfds("hybridpar_digits", "train", args.data_dir)
        tables = []
        if args.network in ("both", "loopback"):
            tables.append(run_network("loopback", run_loopback, args))
        if args.network in ("both", "netns"):
            reason = ShapedLink.unavailable()
            if reason:
                print(f"[netns] skipped: {reason}.")
            else:
                link = stack.enter_context(ShapedLink(args.bandwidth))
                print(f"[netns] veth pair {link.interfaces} between namespaces "
                      f"{link.namespaces}, each end shaped by tc tbf to {args.bandwidth}")
                tables.append(run_network(f"netns {args.bandwidth}", link.run, args))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    table = tables[0] if tables else {}
    nan = float("nan")
    print(f"fp16_bytes_ratio={table.get('fp16', {}).get('bytes_ratio', nan):.4f}")
    print(f"powersgd_bytes_ratio={table.get('powersgd-4', {}).get('bytes_ratio', nan):.4f}")
    print(f"powersgd_accuracy_delta={table.get('powersgd-4', {}).get('accuracy_delta', nan):+.4f}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_worker(args)), flush=True)
    else:
        os.environ.pop("TF_CONFIG", None)  # the parent must not join a cluster
        run_parent(args)


if __name__ == "__main__":
    main()


"""Parameter-server figures on real localhost clusters: fit against a raw loop, wire bytes.

Every run is a cluster of a chief, W workers and one ps, started by
``hybridpar.launch.launch``; every task runs this script (``--child``), the
workers and the ps serve from ``hybridpar.scope()``, and the chief trains a
dense MLP with ``model.fit`` (``data_parallel.mode: parameter_server``, no
partitioner), one warm-up epoch then ``--epochs`` timed ones.

(a) ``fit_vs_raw``: steps/s of the timed epochs of hybridpar's ``model.fit``
against a raw ``tf.distribute`` custom loop on a cluster of the same shape
(chief, 2 workers, 1 ps), the same model, optimizer, data and batch. The raw
tasks never import hybridpar: workers and ps run a ``tf.distribute.Server``,
the chief a ``ParameterServerStrategy`` with a ``ClusterCoordinator`` that
schedules ``steps`` steps per epoch (``strategy.run`` of a GradientTape
step, Keras Adam's ``apply_gradients``, a Keras ``Mean`` of the loss, as
``fit`` tracks it) and joins at the epoch's end, as ``fit`` does. Runs come in
pairs whose order alternates; the result is the median hybridpar rate over
the median raw rate (target >= 0.95).

(b) ``bytes``: one 2-worker run. The chief reads the TCP payload sent on the
cluster's own sockets (``ss -tin``: ``bytes_sent`` minus ``bytes_retrans``,
summed over both ends of every connection to a cluster port) at the start
and end of the timed epochs. Per step a worker pulls the S bytes of
variables from the ps and pushes S bytes of gradients back: 2*S per step, or
2*W*S for W workers stepping once each. The result is measured bytes per
step over 2*S.

(c) ``sparse``: one 2-worker, 2-ps run of the wide-and-deep recommender
(``hybridpar_models.wide_and_deep``: 50,000 x 16 user and 100,000 x 16 item
tables, sharded over both ps by ``min_size``), measured as in (b). Pulling
and pushing whole tables would cost 2*(D+T) per step (D: dense bytes, T:
table bytes); gathering rows costs about 2*D plus the looked-up rows. The
result is measured bytes per step over 2*(D+T).

The last three lines are ``fit_vs_raw=<x>``, ``bytes_ratio=<x>`` and
``sparse_ratio=<x>`` (``nan`` for a part not run).

    python benchmarks/parameter_server.py [--part all|fit_vs_raw|bytes|sparse] [--pairs 5]
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from ab_pairs import VARIANTS, pair_orders  # beside this script
from multiworker import counter_between, parse_task_output, socket_counters

CLUSTER_TIMEOUT_S = 300
SPARSE_PARTITIONER = {"kind": "min_size", "min_shard_bytes": 262144, "max_shards": 2}
SIZES = ("features", "units", "layers", "batch", "steps", "epochs")


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; the parent forwards the sizes to its children."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "fit_vs_raw", "bytes", "sparse"),
                        default="all")
    parser.add_argument("--pairs", type=int, default=5,
                        help="hybridpar/raw pairs of clusters (fit_vs_raw).")
    parser.add_argument("--features", type=int, default=64, help="Input features.")
    parser.add_argument("--units", type=int, default=512, help="Hidden units.")
    parser.add_argument("--layers", type=int, default=2, help="Hidden layers.")
    parser.add_argument("--batch", type=int, default=64, help="Examples per step.")
    parser.add_argument("--steps", type=int, default=60, help="Steps per epoch.")
    parser.add_argument("--epochs", type=int, default=2, help="Timed epochs after 1 warm-up.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=("mlp", "wide_and_deep"), default="mlp",
                        help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default="hybridpar",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", *SIZES):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    return args


def variable_bytes(features: int, units: int, layers: int, classes: int = 10) -> int:
    """Bytes of the MLP's float32 variables: ``features -> units x layers -> classes``."""
    widths = [features] + [units] * layers + [classes]
    return 4 * sum(a * b + b for a, b in itertools.pairwise(widths))


def push_pull_volume(workers: int, variables: int) -> int:
    """Bytes W workers move for one step each: each pulls S and pushes S, 2*W*S."""
    return 2 * workers * variables


def gathered_volume(dense: int, row_bytes: int, batch: int) -> int:
    """Bytes of one step that pulls the dense variables and ``batch`` rows of each table,
    and pushes their gradients: ``2*(D + batch*row_bytes)`` (ids not counted)."""
    return 2 * (dense + batch * row_bytes)


def fit_vs_raw(rates: Sequence[dict[str, float]]) -> tuple[float, float, float]:
    """Median steps/s of hybridpar and raw over the pairs, and their ratio hybridpar/raw."""
    hybrid = statistics.median(p["hybridpar"] for p in rates)
    raw = statistics.median(p["raw"] for p in rates)
    return hybrid, raw, hybrid / raw


def cluster_ports(tf_config: dict[str, Any]) -> list[int]:
    """The ports of every task in a TF_CONFIG."""
    return [int(a.rsplit(":", 1)[1]) for tasks in tf_config["cluster"].values() for a in tasks]


# --------------------------------------------------------------------------- one task


def _payload(ports: Sequence[int]) -> dict:
    try:
        ss = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, timeout=10).stdout
    except OSError:  # no ss: the bytes part reads 0
        ss = ""
    return socket_counters(ss, ports)


def mlp_data(features: int) -> tuple[Any, Any]:
    """The MLP's 4096 examples (the same in both variants)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, features)).astype("float32")
    return x, rng.integers(0, 10, size=(4096,))


def mlp(args: argparse.Namespace) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((args.features,))]
        + [keras.layers.Dense(args.units, activation="relu") for _ in range(args.layers)]
        + [keras.layers.Dense(10)]
    )


def run_raw_task(args: argparse.Namespace) -> dict[str, Any] | None:
    """The raw variant's task: a server on workers and ps, the custom loop on the chief."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc")
        server.join()
        return None
    import keras

    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    x, y = mlp_data(args.features)

    def dataset_fn() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            args.batch, drop_remainder=True).repeat()

    with strategy.scope():
        model = mlp(args)
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
        tracked = keras.metrics.Mean()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_fn(batch: Any) -> None:
        features, labels = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        tracked.update_state(loss, sample_weight=tf.shape(features)[0])

    @tf.function
    def train_function(iterator: Any) -> None:
        strategy.run(step_fn, args=(next(iterator),))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    started = 0.0
    for epoch in range(args.epochs + 1):
        if epoch == 1:
            started = time.perf_counter()
        tracked.reset_state()
        for _ in range(args.steps):
            coordinator.schedule(train_function, args=(iterator,))
        coordinator.join()
    seconds = time.perf_counter() - started
    return {"variant": "raw", "steps_per_s": args.steps * args.epochs / seconds,
            "loss": float(tracked.result())}


def run_task(args: argparse.Namespace) -> dict[str, Any] | None:
    """Runs this task of the cluster in TF_CONFIG; the chief returns its record."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import keras
    import numpy as np

    import hybridpar

    tf_config = json.loads(os.environ["TF_CONFIG"])
    config: dict[str, Any] = {"data_parallel": {"mode": "parameter_server"}}
    if args.model == "wide_and_deep":
        from hybridpar.data.builders import clicks

        x, y = clicks.generate(4096)
        config["parameter_server"] = {"partitioner": SPARSE_PARTITIONER}
    else:
        x, y = mlp_data(args.features)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True)
    with hybridpar.scope(config):
        keras.utils.set_random_seed(0)
        if args.model == "wide_and_deep":
            import hybridpar_models

            model = hybridpar_models.get("wide_and_deep")()
        else:
            model = mlp(args)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ports = cluster_ports(tf_config)
    samples: list[dict[str, Any]] = []

    class Timed(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1:  # the socket read stays outside the timed window
                sockets = _payload(ports)
                samples.append({"time": time.perf_counter(), "sockets": sockets})

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == args.epochs:
                time.sleep(0.3)  # let the last responses leave the socket buffers
                samples.append({"time": time.perf_counter(), "sockets": _payload(ports)})

    history = model.fit(dataset, epochs=args.epochs + 1, steps_per_epoch=args.steps, verbose=0,
                        callbacks=[Timed()])
    start, end = samples
    steps = args.steps * args.epochs
    sharded = [v for v in model.trainable_variables if type(v.value).__name__ == "ShardedVariable"]
    sent = counter_between(start["sockets"], end["sockets"], "bytes_sent")
    retransmitted = counter_between(start["sockets"], end["sockets"], "bytes_retrans")
    return {
        "variant": "hybridpar",
        "loss": float(history.history["loss"][-1]),
        "workers": len(tf_config["cluster"]["worker"]),
        "steps": steps,
        "steps_per_s": steps / (end["time"] - start["time"] - 0.3),
        "payload_bytes": sent - retransmitted,
        "variable_bytes": sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables),
        "sharded_bytes": sum(int(np.prod(v.shape)) * 4 for v in sharded),
        "row_bytes": sum(int(v.shape[1]) * 4 for v in sharded),
    }


# --------------------------------------------------------------------------- the parent


def run_cluster(
    workers: int, args: argparse.Namespace, ps: int = 1, model: str = "mlp",
    variant: str = "hybridpar",
) -> dict[str, Any]:
    """Runs one chief + ``workers`` + ``ps`` cluster of this script; returns the chief's record.

    Raises:
        RuntimeError: with the output tail if the chief fails.
    """
    from hybridpar.launch import launch

    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--model={model}",
           f"--variant={variant}"]
    cmd += [f"--{name}={getattr(args, name)}" for name in SIZES]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    out, err = io.StringIO(), io.StringIO()
    code = launch(cmd, workers, ps, timeout=CLUSTER_TIMEOUT_S, env=env, stdout=out, stderr=err)
    if code != 0:
        raise RuntimeError(
            f"Cluster with {workers} worker(s) exited with {code}:\n"
            f"{out.getvalue()[-2000:]}\n{err.getvalue()[-4000:]}"
        )
    return parse_task_output(out.getvalue(), "chief:0")


def fit_vs_raw_part(args: argparse.Namespace) -> float:
    rates = []
    for i, order in enumerate(pair_orders(args.pairs)):
        records = {variant: run_cluster(2, args, variant=variant) for variant in order}
        rates.append({variant: record["steps_per_s"] for variant, record in records.items()})
        print(f"pair {i + 1}/{args.pairs} (first: {order[0]}): hybridpar fit "
              f"{rates[-1]['hybridpar']:.1f} steps/s, raw loop {rates[-1]['raw']:.1f} steps/s; "
              f"last epoch's loss {records['hybridpar']['loss']:.4f}/{records['raw']['loss']:.4f}",
              flush=True)
    hybrid, raw, ratio = fit_vs_raw(rates)
    print(f"chief + 2 workers + 1 ps; median steps/s: hybridpar model.fit {hybrid:.1f}, raw "
          f"ClusterCoordinator loop {raw:.1f} (target ratio >= 0.95, not asserted)", flush=True)
    return ratio


def bytes_part(args: argparse.Namespace) -> float:
    record = run_cluster(2, args)
    size = record["variable_bytes"]
    per_step = record["payload_bytes"] / record["steps"]
    analytic = push_pull_volume(1, size)
    print(f"variables S={size} B; payload {record['payload_bytes']} B over {record['steps']} "
          f"steps = {per_step:.0f} B/step; analytic 2*S = {analytic} B/step (2*W*S = "
          f"{push_pull_volume(record['workers'], size)} B for W={record['workers']} workers "
          f"stepping once each); measured/analytic {per_step / analytic:.3f}", flush=True)
    return per_step / analytic


def sparse_part(args: argparse.Namespace) -> float:
    record = run_cluster(2, args, ps=2, model="wide_and_deep")
    tables, total = record["sharded_bytes"], record["variable_bytes"]
    per_step = record["payload_bytes"] / record["steps"]
    whole = push_pull_volume(1, total)
    rows = gathered_volume(total - tables, record["row_bytes"], args.batch)
    print(f"wide_and_deep: tables T={tables} B sharded over 2 ps, dense D={total - tables} B; "
          f"payload {per_step:.0f} B/step; whole-table pull+push 2*(D+T) = {whole} B/step "
          f"(measured/whole {per_step / whole:.4f}); dense plus looked-up rows "
          f"2*(D + batch*row bytes) = {rows} B/step (measured/that {per_step / rows:.2f})",
          flush=True)
    return per_step / whole


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        record = run_raw_task(args) if args.variant == "raw" else run_task(args)
        print(json.dumps(record), flush=True)
        return
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; chief + 2 workers + ps on "
          f"localhost; MLP {args.features}-{'-'.join([str(args.units)] * args.layers)}-10 "
          f"(S={variable_bytes(args.features, args.units, args.layers)} B), batch "
          f"{args.batch}, {args.steps} steps x {args.epochs} timed epochs, Adam", flush=True)
    fit_ratio = fit_vs_raw_part(args) if args.part in ("all", "fit_vs_raw") else math.nan
    bytes_ratio = bytes_part(args) if args.part in ("all", "bytes") else math.nan
    sparse_ratio = sparse_part(args) if args.part in ("all", "sparse") else math.nan
    print(f"fit_vs_raw={fit_ratio:.3f}")
    print(f"bytes_ratio={bytes_ratio:.3f}")
    print(f"sparse_ratio={sparse_ratio:.4f}")


if __name__ == "__main__":
    main()

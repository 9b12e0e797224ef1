"""Step-time overhead of ``hybridpar.scope`` against a hand-built MirroredStrategy.

The same Keras MLP and in-memory data are trained with ``model.fit`` under
``hybridpar.scope(config)`` (mode ``mirrored`` over 2 logical CPUs) and under
``tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])``. Every run is a fresh
child process (this script re-invoked with ``--child``); runs are interleaved in
A/B pairs whose order alternates, to cancel drift. Each child times every step
after a warm-up epoch and prints one JSON line; the parent prints the medians
and, as its last line, ``ratio=<hybridpar/raw>``.

With ``--steps_per_execution N`` (N > 1) hybridpar's ``model.fit`` runs N
steps per traced call (``model.compile(steps_per_execution=N)``). Keras's
own N-step loop fails under a hand-built MirroredStrategy
(keras-team/keras#19246), so the raw variant is then the standard
``tf.distribute`` custom loop of the same model, optimizer and data, N
steps of ``strategy.run`` per ``tf.function`` call. Either way the figure
is the time per step (an execution's time divided by the steps it ran).

    python benchmarks/overhead.py [--pairs 5] [--steps_per_execution 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from ab_pairs import VARIANTS, pair_orders, parse_child_output, summarize  # beside this script

DEVICES = ("/cpu:0", "/cpu:1")
SEED = 1234
CHILD_TIMEOUT_S = 300


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line (the parent forwards its sizes to the children)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs of child runs.")
    parser.add_argument("--epochs", type=int, default=20, help="Timed epochs per child.")
    parser.add_argument("--examples", type=int, default=4096, help="Examples in the dataset.")
    parser.add_argument("--features", type=int, default=64, help="Input features.")
    parser.add_argument("--units", type=int, default=512, help="Units of the 2 hidden layers.")
    parser.add_argument("--batch", type=int, default=256, help="Global batch size.")
    parser.add_argument(
        "--intra_op_threads",
        type=int,
        default=1,
        help="Threads per op (0: TensorFlow's default); 1 lets the 2 replicas run side by side.",
    )
    parser.add_argument(
        "--keep_remainder",
        action="store_true",
        help="batch() without drop_remainder: dynamic batch shapes and a final partial batch, "
        "so hybridpar's even split and replica-share weighting run on every step.",
    )
    parser.add_argument(
        "--steps_per_execution",
        type=int,
        default=1,
        help="Training steps per traced call (model.compile(steps_per_execution=N)).",
    )
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "epochs", "examples", "features", "units", "batch",
                 "steps_per_execution"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.intra_op_threads < 0:
        parser.error(f"--intra_op_threads must be >= 0. Received: {args.intra_op_threads}.")
    if args.batch % len(DEVICES) or args.examples < args.batch:
        parser.error(
            f"--batch must be a multiple of {len(DEVICES)} and <= --examples. "
            f"Received: --batch={args.batch} --examples={args.examples}."
        )
    return args


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Trains in this process under ``variant`` and returns the timing record."""
    import hybridpar

    hybridpar.testing.use_logical_cpus(len(DEVICES), args.intra_op_threads or None)
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((args.examples, args.features), dtype=np.float32)
    y = rng.integers(0, 10, size=(args.examples,), dtype=np.int32)

    if variant == "hybridpar":
        config = hybridpar.StrategyConfig.from_dict(
            {
                "data_parallel": {"mode": "mirrored", "devices": list(DEVICES)},
                "data": {"global_batch_size": args.batch},
            }
        )
        context = hybridpar.scope(config)
    else:
        context = tf.distribute.MirroredStrategy(list(DEVICES)).scope()

    step_times: list[float] = []
    spe = args.steps_per_execution

    class StepTimer(keras.callbacks.Callback):
        """Records each execution's duration per step, skipping the warm-up (first) epoch."""

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch > 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start, self._first = time.perf_counter(), batch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                steps = min(batch + 1, batches) - self._first
                step_times.append((time.perf_counter() - self._start) / steps)

    with context:
        strategy = tf.distribute.get_strategy()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
            args.batch, drop_remainder=not args.keep_remainder
        )
        batches = int(dataset.cardinality())
        model = keras.Sequential(
            [
                keras.Input((args.features,)),
                keras.layers.Dense(args.units, activation="relu"),
                keras.layers.Dense(args.units, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if variant == "hybridpar" or spe == 1:
            model.compile(optimizer="adam", loss=loss, steps_per_execution=spe)
    if variant == "hybridpar" or spe == 1:
        history = model.fit(
            dataset, epochs=1 + args.epochs, verbose=0, shuffle=False, callbacks=[StepTimer()]
        )
        final_loss = float(history.history["loss"][-1])
    else:
        final_loss = _custom_loop(model, strategy, dataset, args, step_times)

    extended = strategy.extended
    cross_ops = getattr(extended, "_cross_device_ops", None) or getattr(
        extended, "_inferred_cross_device_ops", None
    )
    return {
        "variant": variant,
        "median_step_s": statistics.median(step_times),
        "mean_step_s": statistics.mean(step_times),
        "steps": len(step_times),
        "final_loss": final_loss,
        "strategy": type(strategy).__name__,
        "cross_device_ops": type(cross_ops).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "devices": list(extended.worker_devices),
        "params": model.count_params(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }


def _custom_loop(model: Any, strategy: Any, dataset: Any, args: argparse.Namespace,
                 step_times: list[float]) -> float:
    """The standard tf.distribute loop, ``steps_per_execution`` steps per traced call.

    Returns the mean loss over the last epoch's steps (what Keras logs).
    """
    import keras
    import tensorflow as tf

    spe = args.steps_per_execution
    with strategy.scope():
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(y, model(x, training=True)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def execution(iterator: Any, steps: Any) -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            per_replica = strategy.run(step_fn, args=next(iterator))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    batches = int(dataset.cardinality())
    distributed = strategy.experimental_distribute_dataset(dataset)
    for epoch in range(1 + args.epochs):
        iterator, total = iter(distributed), 0.0
        for first in range(0, batches, spe):
            steps = min(spe, batches - first)
            start = time.perf_counter()
            total += float(execution(iterator, tf.constant(steps)))
            if epoch > 0:
                step_times.append((time.perf_counter() - start) / steps)
    return total / batches


def spawn(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one child process and returns its record.

    Raises:
        RuntimeError: with the child's stderr tail if it fails.
    """
    sizes = ("epochs", "examples", "features", "units", "batch", "intra_op_threads",
             "steps_per_execution")
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={variant}"]
    cmd += [f"--{name}={getattr(args, name)}" for name in sizes]
    cmd += ["--keep_remainder"] if args.keep_remainder else []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(
            f"Child --child={variant} exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return parse_child_output(proc.stdout)


def run_parent(args: argparse.Namespace) -> None:
    """Runs the interleaved pairs and prints the comparison; the last line is the ratio."""
    start = time.perf_counter()
    medians: list[dict[str, float]] = []
    means: list[dict[str, float]] = []
    first: dict[str, dict[str, Any]] = {}
    for i, order in enumerate(pair_orders(args.pairs)):
        records = {variant: spawn(variant, args) for variant in order}
        for variant, record in records.items():
            first.setdefault(variant, record)
        medians.append({v: records[v]["median_step_s"] for v in VARIANTS})
        means.append({v: records[v]["mean_step_s"] for v in VARIANTS})
        hyb, raw = records["hybridpar"], records["raw"]
        print(
            f"pair {i + 1}/{args.pairs} (first: {order[0]:9s}) median step "
            f"hybridpar={hyb['median_step_s'] * 1e3:.3f} ms raw={raw['median_step_s'] * 1e3:.3f} ms"
            f" (mean {hyb['mean_step_s'] * 1e3:.3f}/{raw['mean_step_s'] * 1e3:.3f} ms) "
            f"final loss {hyb['final_loss']:.6f}/{raw['final_loss']:.6f}",
            flush=True,
        )
    info = first["raw"]
    raw = ("model.fit" if args.steps_per_execution == 1 else
           f"a tf.function loop of {args.steps_per_execution} strategy.run steps per call")
    print(
        f"compared: model.fit (steps_per_execution={args.steps_per_execution}) under "
        f"hybridpar.scope(data_parallel.mode=mirrored) vs {raw} under a hand-built "
        f"tf.distribute.MirroredStrategy; TensorFlow {info['tensorflow']}, Keras {info['keras']}"
    )
    for variant in VARIANTS:
        rec = first[variant]
        print(
            f"  {variant:9s}: {rec['strategy']} with {rec['cross_device_ops']}, "
            f"{rec['replicas']} replicas on {', '.join(rec['devices'])}"
        )
    threads = args.intra_op_threads or "TF default"
    print(
        f"model: MLP {args.features}-{args.units}-{args.units}-10 ({info['params']:,} params), "
        f"adam; data {args.examples}x{args.features} in memory; global batch {args.batch} "
        f"({'dynamic, final partial batch kept' if args.keep_remainder else 'drop_remainder'}); "
        f"intra-op threads {threads}; 1 warm-up + {args.epochs} timed epochs "
        f"({info['steps']} timed executions/child); {args.pairs} pairs, "
        f"{2 * args.pairs} processes, "
        f"{time.perf_counter() - start:.0f} s"
    )
    mean_ratio = summarize(means)[2]
    print(f"mean-step ratio (includes per-epoch start-up steps): {mean_ratio:.3f}")
    hybrid, raw, ratio = summarize(medians)
    print(f"median step over pairs: hybridpar={hybrid * 1e3:.3f} ms raw={raw * 1e3:.3f} ms")
    print(f"ratio={ratio:.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: the parent by default, one timed training run with ``--child``."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args)), flush=True)
    else:
        run_parent(args)


if __name__ == "__main__":
    main()

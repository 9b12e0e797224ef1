"""Step time with XLA against without, under hybridpar's mirrored strategy and on one device.

The same seeded Keras MLP and in-memory data are trained with ``model.fit``
under ``hybridpar.scope`` compiled with ``jit_compile=True`` and with
``jit_compile=False``, in two settings: ``data_parallel.mode: mirrored``
over 2 logical CPUs (each replica's forward, loss and gradients compiled by
XLA for its device, ``hybridpar.compat.xla_replicas``) and ``mode: none``
(one device; the whole step compiled, as Keras does). Every run is a fresh
child process (this script re-invoked with ``--child``); runs come in pairs
whose order alternates. Each child times every step after a warm-up epoch
and reports its median; a pair's line also shows both final losses, which
must agree to float tolerance. The last two lines are
``one_device_xla_ratio=<with / without>`` and ``xla_ratio=<with / without>``
(mirrored); below 1 means XLA is faster.

    python benchmarks/xla.py [--pairs 5]
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

from ab_pairs import parse_child_output  # beside this script

MODES = {"mirrored": ("/cpu:0", "/cpu:1"), "none": ("/cpu:0",)}
SEED = 1234
CHILD_TIMEOUT_S = 300


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="XLA/no-XLA pairs per mode.")
    parser.add_argument("--epochs", type=int, default=10, help="Timed epochs per child.")
    parser.add_argument("--examples", type=int, default=4096, help="Examples in the dataset.")
    parser.add_argument("--features", type=int, default=64, help="Input features.")
    parser.add_argument("--units", type=int, default=512, help="Units of the 2 hidden layers.")
    parser.add_argument("--batch", type=int, default=256, help="Global batch size.")
    parser.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--jit_compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "epochs", "examples", "features", "units", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.batch % 2 or args.examples < args.batch:
        parser.error(f"--batch must be even and <= --examples. Received: --batch={args.batch} "
                     f"--examples={args.examples}.")
    return args


def pair_orders(pairs: int) -> list[tuple[bool, bool]]:
    """``jit_compile`` of each pair's two runs: XLA first in even pairs, second in odd ones."""
    return [(True, False) if i % 2 == 0 else (False, True) for i in range(pairs)]


def ratio(pairs: Sequence[dict[bool, float]]) -> float:
    """Median step time with XLA over the median without, over the pairs."""
    return (statistics.median(p[True] for p in pairs)
            / statistics.median(p[False] for p in pairs))


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """Trains in this process and returns the timing record."""
    import hybridpar

    devices = MODES[args.child]
    hybridpar.testing.use_logical_cpus(len(devices), intra_op_threads=1)
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((args.examples, args.features), dtype=np.float32)
    y = rng.integers(0, 10, size=(args.examples,), dtype=np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True)
    config = {"data_parallel": {"mode": args.child, "devices": list(devices)},
              "data": {"global_batch_size": args.batch}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([
            keras.Input((args.features,)),
            keras.layers.Dense(args.units, activation="relu"),
            keras.layers.Dense(args.units, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=args.jit_compile)
    step_times: list[float] = []

    class StepTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch > 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                step_times.append(time.perf_counter() - self._start)

    history = model.fit(dataset, epochs=1 + args.epochs, verbose=0, callbacks=[StepTimer()])
    return {"median_step_s": statistics.median(step_times), "steps": len(step_times),
            "final_loss": float(history.history["loss"][-1]), "jit_compile": model.jit_compile,
            "replicas": hs.num_replicas, "tensorflow": tf.__version__,
            "keras": keras.__version__}


def spawn(mode: str, jit_compile: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one child process and returns its record.

    Raises:
        RuntimeError: with the child's stderr tail if it fails.
    """
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={mode}"]
    cmd += [f"--{name}={getattr(args, name)}"
            for name in ("epochs", "examples", "features", "units", "batch")]
    cmd += ["--jit_compile"] if jit_compile else []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"Child {mode} jit_compile={jit_compile} exited with "
                           f"{proc.returncode}:\n{proc.stderr[-3000:]}")
    return parse_child_output(proc.stdout)


def measure(mode: str, args: argparse.Namespace) -> float:
    """The interleaved pairs of one mode; prints each pair and returns the ratio."""
    pairs = []
    for i, order in enumerate(pair_orders(args.pairs)):
        records = {jit: spawn(mode, jit, args) for jit in order}
        pairs.append({jit: record["median_step_s"] for jit, record in records.items()})
        xla, plain = records[True], records[False]
        print(f"{mode} pair {i + 1}/{args.pairs} (first: {'XLA' if order[0] else 'no XLA'}) "
              f"median step XLA={xla['median_step_s'] * 1e3:.3f} ms "
              f"no XLA={plain['median_step_s'] * 1e3:.3f} ms; final loss "
              f"{xla['final_loss']:.6f}/{plain['final_loss']:.6f}; "
              f"{xla['replicas']} replica(s), jit_compile={xla['jit_compile']}", flush=True)
    return ratio(pairs)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)), flush=True)
        return
    start = time.perf_counter()
    print(f"model.fit with jit_compile=True vs False under hybridpar.scope; MLP "
          f"{args.features}-{args.units}-{args.units}-10, adam, batch {args.batch}, "
          f"{args.examples} examples in memory, 1 intra-op thread per device, 1 warm-up + "
          f"{args.epochs} timed epochs per child; {args.pairs} pairs per mode", flush=True)
    one_device = measure("none", args)
    mirrored = measure("mirrored", args)
    print(f"wall time {time.perf_counter() - start:.0f} s")
    print(f"one_device_xla_ratio={one_device:.3f}")
    print(f"xla_ratio={mirrored:.3f}")


if __name__ == "__main__":
    main()

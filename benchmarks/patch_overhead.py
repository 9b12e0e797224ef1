"""Does using hybridpar slow down plain Keras afterwards in the same process?

Two kinds of child process run the same plain Keras work, with no strategy:
``hybridpar`` first builds a hybridpar scope, trains a model in it, leaves
it and keeps it alive (so every fix it installed stays installed); ``raw``
never imports hybridpar. Each child then times eager calls ``model(x)`` of a
7-layer MLP and the steps of ``model.fit`` of the same model, and prints one
JSON line. Children run in interleaved A/B pairs whose order alternates; the
parent prints the medians and, on its last two lines, ``eager_ratio=`` and
``fit_ratio=`` (hybridpar/raw; 1.0 means no cost).

    python benchmarks/patch_overhead.py [--pairs 5] [--stages 2]

``--stages 2`` makes the scope model-parallel, so the stage-placement hooks
(``Layer.__call__``, the tape's gradient function) are installed too; both
kinds of child then split the CPU into 2 logical devices.
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

SEED = 7
CHILD_TIMEOUT_S = 300
LAYERS = 7


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line (the parent forwards its sizes to the children)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs of child runs.")
    parser.add_argument("--calls", type=int, default=400, help="Timed eager calls per child.")
    parser.add_argument("--epochs", type=int, default=5, help="Timed fit epochs per child.")
    parser.add_argument("--units", type=int, default=256, help="Units of each hidden layer.")
    parser.add_argument("--batch", type=int, default=64, help="Batch size of calls and steps.")
    parser.add_argument("--stages", type=int, default=1, choices=(1, 2),
                        help="model_parallel.stages of the scope used before (2 installs the "
                        "stage hooks).")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "calls", "epochs", "units", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    return args


def logical_cpus(count: int) -> None:
    """Splits the CPU into ``count`` logical devices, as both kinds of child must."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )


def use_and_leave_hybridpar(stages: int) -> Any:
    """Builds, trains in and leaves a hybridpar scope; returns what keeps it alive."""
    import keras
    import numpy as np

    import hybridpar

    config = {"data_parallel": {"mode": "none"}, "model_parallel": {"stages": stages}}
    if stages > 1:
        config["model_parallel"]["placement"] = {"^used_1$": 1}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="used_0"),
                                  keras.layers.Dense(1, name="used_1")])
        model.compile("sgd", "mse")
    model.fit(np.ones((16, 8)), np.ones((16, 1)), batch_size=8, epochs=1, verbose=0)
    return hs, model, [fix.name for fix in hybridpar.compat.installed()]


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Times plain Keras in this process (after using hybridpar for ``hybridpar``)."""
    logical_cpus(args.stages)
    kept = use_and_leave_hybridpar(args.stages) if variant == "hybridpar" else None
    import keras
    import numpy as np

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((args.batch * 16, args.units), dtype=np.float32)
    y = rng.integers(0, 10, size=(args.batch * 16,), dtype=np.int32)
    hidden = [keras.layers.Dense(args.units, activation="relu") for _ in range(LAYERS - 1)]
    model = keras.Sequential([keras.Input((args.units,)), *hidden, keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch = x[: args.batch]
    for _ in range(20):
        model(batch)
    calls = []
    for _ in range(args.calls):
        start = time.perf_counter()
        model(batch)
        calls.append(time.perf_counter() - start)
    steps: list[float] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.params and self._epoch > 0:
                steps.append(time.perf_counter() - self._start)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch

    model.fit(x, y, batch_size=args.batch, epochs=1 + args.epochs, verbose=0, shuffle=False,
              callbacks=[StepTimer()])
    return {
        "variant": variant,
        "eager_s": statistics.median(calls),
        "fit_step_s": statistics.median(steps),
        "fixes": kept[2] if kept else [],
    }


def spawn(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one child process and returns its record.

    Raises:
        RuntimeError: with the child's stderr tail if it fails.
    """
    sizes = ("calls", "epochs", "units", "batch", "stages")
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={variant}"]
    cmd += [f"--{name}={getattr(args, name)}" for name in sizes]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(
            f"Child --child={variant} exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return parse_child_output(proc.stdout)


def run_parent(args: argparse.Namespace) -> None:
    """Runs the interleaved pairs and prints the ratios (the last two lines)."""
    start = time.perf_counter()
    eager: list[dict[str, float]] = []
    fit: list[dict[str, float]] = []
    fixes: list[str] = []
    for i, order in enumerate(pair_orders(args.pairs)):
        records = {variant: spawn(variant, args) for variant in order}
        fixes = records["hybridpar"]["fixes"]
        eager.append({v: records[v]["eager_s"] for v in VARIANTS})
        fit.append({v: records[v]["fit_step_s"] for v in VARIANTS})
        print(
            f"pair {i + 1}/{args.pairs} (first: {order[0]:9s}) eager model(x) "
            f"{eager[-1]['hybridpar'] * 1e6:.0f}/{eager[-1]['raw'] * 1e6:.0f} us, fit step "
            f"{fit[-1]['hybridpar'] * 1e3:.3f}/{fit[-1]['raw'] * 1e3:.3f} ms (hybridpar used/raw)",
            flush=True,
        )
    print(
        f"plain Keras MLP, {LAYERS} Dense layers of {args.units} units, batch {args.batch}; "
        f"{args.calls} eager calls and 1 + {args.epochs} fit epochs per child; hybridpar used "
        f"before with model_parallel.stages={args.stages}, fixes installed: {', '.join(fixes)}; "
        f"{args.pairs} pairs, {time.perf_counter() - start:.0f} s"
    )
    eager_used, eager_raw, eager_ratio = summarize(eager)
    fit_used, fit_raw, fit_ratio = summarize(fit)
    print(f"median eager call: used={eager_used * 1e6:.1f} us raw={eager_raw * 1e6:.1f} us")
    print(f"median fit step: used={fit_used * 1e3:.3f} ms raw={fit_raw * 1e3:.3f} ms")
    print(f"eager_ratio={eager_ratio:.3f}")
    print(f"fit_ratio={fit_ratio:.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: the parent by default, one timed child with ``--child``."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args)), flush=True)
    else:
        run_parent(args)


if __name__ == "__main__":
    main()

"""Resuming ``fit`` deep into an epoch: the saved input iterator against replaying batches.

A ``--mode`` strategy (default ``mirrored`` over 2 logical CPUs) trains a small MLP on
an epoch of ``--epoch_steps`` batches (from_tensor_slices, shuffle, map, batch) with
``PeriodicCheckpoint`` and stops after step N, the step of its last checkpoint; a new
process then resumes ``fit`` from it and stops after its first trained step. The time
from ``fit``'s start to the end of that step (restore included) is measured for N = 100
and N = 10,000, each ``--repeats`` times in fresh processes, the two steps taking turns:

- with the saved iterator (``checkpoint.save_iterator: true``, hybridpar's default): the
  input's position is restored, nothing is drawn again;
- replaying (``checkpoint.save_iterator: false``, TensorFlow's distributed iterator): the
  N batches already trained are drawn again in one graph loop.

It also times training steps 100 to 2,100 of the same ``fit`` (checkpoints every 500
steps) with each input, ``--repeats`` fresh processes each, taking turns:
``input_step_time_ratio`` is the median step time with the saved iterator over the
median with TensorFlow's distributed iterator.

    python benchmarks/resume.py [--mode mirrored] [--repeats 3] [--epoch_steps 20000]

The last lines are ``input_step_time_ratio=``, ``replay_resume_step_cost_ratio=`` and
``resume_step_cost_ratio=`` (median at step 10,000 / median at step 100, each; target
<= 1.2 for the saved iterator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any

RESULT_PREFIX = "RESUME_BENCH "
STEPS = (100, 10_000)
KINDS = ("replay", "restore")
TIMED = (100, 2_100)  # the steps timed for the step time, after warm-up


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="mirrored", choices=["none", "mirrored"])
    parser.add_argument("--repeats", type=int, default=3, help="Timed resumes per step.")
    parser.add_argument("--epoch_steps", type=int, default=20_000, help="Batches per epoch.")
    parser.add_argument("--child", choices=["train", "resume", "steps"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--step", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats <= 0:
        parser.error(f"--repeats must be positive. Received: {args.repeats}")
    if args.epoch_steps <= max(STEPS):
        parser.error(f"--epoch_steps must exceed {max(STEPS)}. Received: {args.epoch_steps}")
    return args


def summary(seconds: dict[str, dict[str, list[float]]],
            step_seconds: dict[str, list[float]]) -> list[str]:
    """The report's lines: each kind's median seconds at each step, the three ratios last."""
    restore, replay = (statistics.median(step_seconds[k]) for k in ("restore", "replay"))
    lines = [f"step time, steps {TIMED[0]} to {TIMED[1]}: {restore * 1e3:.2f} ms with the "
             f"saved iterator, {replay * 1e3:.2f} ms with TensorFlow's distributed iterator "
             f"(runs " + " ".join(f"{t * 1e3:.2f}" for t in step_seconds["restore"]) + " and "
             + " ".join(f"{t * 1e3:.2f}" for t in step_seconds["replay"]) + ")"]
    ratios = [f"input_step_time_ratio={restore / replay:.3f}"]
    for kind in KINDS:
        low, high = (statistics.median(seconds[kind][str(step)]) for step in STEPS)
        runs = ", ".join(f"step {s}: " + " ".join(f"{t:.2f}" for t in seconds[kind][str(s)])
                         for s in STEPS)
        lines.append(f"{kind}: fit start to the first trained step, {low:.2f} s at step "
                     f"{STEPS[0]}, {high:.2f} s at step {STEPS[1]} (runs {runs})")
        name = "resume_step_cost_ratio" if kind == "restore" else f"{kind}_resume_step_cost_ratio"
        ratios.append(f"{name}={high / low:.3f}")
    return lines + ratios


def parse_result(output: str) -> float:
    """The seconds a ``resume`` or ``steps`` child printed."""
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            return float(json.loads(line[len(RESULT_PREFIX):])["seconds"])
    raise ValueError(f"the child printed no {RESULT_PREFIX.strip()} line")


# --------------------------------------------------------------------------- the children


def _fit(args: argparse.Namespace, stop: Any) -> None:
    """``fit`` with checkpoints every ``args.step`` steps; ``stop`` ends it."""
    import keras
    import numpy as np
    import tensorflow as tf

    import hybridpar

    if args.mode == "mirrored":
        hybridpar.initialize(logical_cpus=2)
    rng = np.random.default_rng(0)
    examples = args.epoch_steps * 8
    x = rng.normal(size=(examples, 16)).astype("float32")
    y = rng.normal(size=(examples, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1)
    data = data.map(lambda a, b: (a * 0.5, b)).batch(8)
    config = {"data_parallel": {"mode": args.mode}, "data": {"global_batch_size": 8},
              "checkpoint": {"dir": args.dir, "every_steps": args.step, "every_epochs": None,
                             "save_iterator": args.kind == "restore"}}
    keras.utils.set_random_seed(1)
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(data, epochs=1, verbose=0, callbacks=[*hs.callbacks(), stop])


def child(args: argparse.Namespace) -> None:
    import keras

    if args.child == "steps":

        class Timer(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                step = int(self.model.optimizer.iterations.numpy())
                if step == TIMED[0]:
                    self.start = time.perf_counter()
                elif step == TIMED[1]:
                    self.seconds = (time.perf_counter() - self.start) / (TIMED[1] - TIMED[0])
                    self.model.stop_training = True

        timer = Timer()
        _fit(args, timer)
        print(RESULT_PREFIX + json.dumps({"seconds": timer.seconds}), flush=True)
        return
    if args.child == "train":

        class Stop(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if int(self.model.optimizer.iterations.numpy()) == args.step:
                    self.model.stop_training = True

        _fit(args, Stop())
        return

    class FirstStep(keras.callbacks.Callback):
        """Stops after the first trained step (a replayed batch returns no logs)."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if int(self.model.optimizer.iterations.numpy()) > args.step:
                self.seen = time.perf_counter()
                self.model.stop_training = True

    first = FirstStep()
    start = time.perf_counter()
    _fit(args, first)
    print(RESULT_PREFIX + json.dumps({"seconds": first.seen - start}), flush=True)


# --------------------------------------------------------------------------- the parent


def run_child(args: argparse.Namespace, role: str, kind: str, step: int, directory: str) -> str:
    command = [sys.executable, __file__, "--child", role, "--kind", kind, "--step", str(step),
               "--dir", directory, "--mode", args.mode, "--epoch_steps", str(args.epoch_steps)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        sys.stderr.write(run.stderr[-4000:])
        raise SystemExit(f"the {role} child ({kind}, step {step}) failed with {run.returncode}")
    return run.stdout


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    work = tempfile.mkdtemp(prefix="hybridpar-resume-")
    try:
        seconds: dict[str, dict[str, list[float]]] = {k: {str(s): [] for s in STEPS}
                                                      for k in KINDS}
        for kind in KINDS:
            for step in STEPS:
                run_child(args, "train", kind, step, os.path.join(work, f"{kind}-{step}"))
        step_seconds: dict[str, list[float]] = {k: [] for k in KINDS}
        for repeat in range(args.repeats):
            for step in STEPS if repeat % 2 == 0 else STEPS[::-1]:
                for kind in KINDS:
                    output = run_child(args, "resume", kind, step,
                                       os.path.join(work, f"{kind}-{step}"))
                    seconds[kind][str(step)].append(parse_result(output))
            for kind in KINDS if repeat % 2 == 0 else KINDS[::-1]:
                output = run_child(args, "steps", kind, 500,
                                   os.path.join(work, f"steps-{kind}-{repeat}"))
                step_seconds[kind].append(parse_result(output))
        print(f"resume.py: TensorFlow {metadata.version('tensorflow')}, Keras "
              f"{metadata.version('keras')}; mode={args.mode}"
              f"{' over 2 logical CPUs' if args.mode == 'mirrored' else ''}; MLP 16-8-1, SGD, "
              f"batches of 8, an epoch of {args.epoch_steps} batches; {args.repeats} fresh "
              "processes per figure")
        for line in summary(seconds, step_seconds):
            print(line)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Pipeline speedup against the GPipe bound, on two logical CPU devices.

Two stages of equal cost (each a stack of Dense layers) are placed on two
logical CPUs with one intra-op thread each, so each device gets one core.
``model.fit`` steps are timed for M = 1 (naive model parallel: one stage works
while the other waits) and M = 2, 4, 8 microbatches. All variants live in one
process and are timed in interleaved rounds (the order rotates) to cancel
drift. For each M the script prints the measured speedup over M = 1, the GPipe
bound ``M*K/(M+K-1)`` and their ratio; its last line is
``efficiency=<measured / bound at M=4>``.

The profile part (skip it with ``--no-profile``) records two steps of each M
with TensorFlow's profiler and sums the time of the MatMul ops by phase:
forward, and backward (activation and weight gradients). The work of a step
is the same for every M, so backward MatMul time that grows with M is
efficiency lost to smaller products (per-microbatch weight gradients were
that loss; ``hybridpar.parallel.weight_gradients`` computes them once per
batch). Op times are CPU time, so they hold up better than step times on a
busy machine, but they are not immune to it.

    python benchmarks/pipeline.py [--rounds 5] [--units 1024] [--batch 512] [--no-profile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

STAGES = 2
MICROBATCHES = (1, 2, 4, 8)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds.")
    parser.add_argument("--steps", type=int, default=12, help="Timed steps per round.")
    parser.add_argument("--units", type=int, default=1024, help="Width of every Dense layer.")
    parser.add_argument("--layers", type=int, default=3, help="Dense layers per stage.")
    parser.add_argument("--batch", type=int, default=512, help="Batch size.")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                        help="Also profile MatMul time per phase for each M.")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "units", "layers", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.batch % max(MICROBATCHES):
        parser.error(f"--batch must be a multiple of {max(MICROBATCHES)}. "
                     f"Received: {args.batch}.")
    return args


def speedups(step_seconds: Mapping[int, float]) -> dict[int, tuple[float, float, float]]:
    """For each M: (measured speedup over M=1, GPipe bound, measured / bound)."""
    from hybridpar.parallel.schedule import gpipe_speedup_bound

    base = step_seconds[1]
    result = {}
    for microbatches, seconds in sorted(step_seconds.items()):
        measured = base / seconds
        bound = gpipe_speedup_bound(microbatches, STAGES)
        result[microbatches] = (measured, bound, measured / bound)
    return result


def matmul_phases(ops: Sequence[tuple[str, str, int, int]], steps: int) -> dict[str, float]:
    """Seconds per step of the MatMul ops of each phase, from profiled (name, type, start, end).

    Backward ops are those TensorFlow's tape builds (``gradient_tape/...``)
    and hybridpar's once-per-batch weight gradients (``.../weight_gradients/...``).
    """
    phases = {"forward": 0.0, "backward": 0.0}
    for name, op_type, start, end in ops:
        if "MatMul" not in op_type:  # MatMul, and oneDNN's _MklMatMul, _MklNativeFusedMatMul
            continue
        backward = "gradient_tape" in name or "weight_gradients" in name
        phases["backward" if backward else "forward"] += (end - start) / 1e9 / steps
    return phases


def profile_matmuls(model: Any, data: Any, steps: int = 2) -> dict[str, float]:
    """MatMul seconds per step by phase over ``steps`` profiled steps of ``model.fit``."""
    import tempfile

    import tensorflow as tf

    from hybridpar.parallel.timeline import profiled_ops

    model.fit(data.take(1), epochs=1, verbose=0)  # the traced function is warm
    with tempfile.TemporaryDirectory(prefix="pipeline-profile-") as trace_dir:
        tf.profiler.experimental.start(trace_dir)
        model.fit(data.take(steps), epochs=1, verbose=0)
        tf.profiler.experimental.stop()
        return matmul_phases(profiled_ops(trace_dir), steps)


def build(microbatches: int, args: argparse.Namespace) -> Any:
    import keras

    import hybridpar

    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": STAGES, "microbatches": microbatches,
                           "placement": {"^stage0_": 0, "^stage1_": 1}},
        "data": {"global_batch_size": args.batch},
    }
    keras.utils.set_random_seed(0)
    with hybridpar.scope(config):
        inputs = keras.Input((args.units,))
        x = inputs
        for stage in range(STAGES):
            for layer in range(args.layers):
                x = keras.layers.Dense(args.units, activation="relu",
                                       name=f"stage{stage}_dense{layer}")(x)
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    return model


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    import hybridpar
    from hybridpar.parallel.schedule import bubble_fraction

    hybridpar.testing.use_logical_cpus(STAGES, intra_op_threads=1)
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.units), dtype=np.float32)
    # One batch repeated from memory: the input costs nothing, so it takes no core
    # from the two stages (a numpy array would be fed by a Python generator thread).
    data = tf.data.Dataset.from_tensors((x, np.tanh(x))).repeat(args.steps + 1)
    models = {m: build(m, args) for m in MICROBATCHES}
    medians: dict[int, list[float]] = {m: [] for m in MICROBATCHES}

    class StepTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.times: list[float] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch > 0:  # the first step of a fit call includes its set-up
                self.times.append(time.perf_counter() - self._start)

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: {STAGES} stages x "
          f"{args.layers} Dense({args.units}) on 2 logical CPUs (1 intra-op thread each), "
          f"batch {args.batch}, {args.rounds} rounds x {args.steps} steps", flush=True)
    for round_index in range(args.rounds):
        shift = round_index % len(MICROBATCHES)
        for microbatches in MICROBATCHES[shift:] + MICROBATCHES[:shift]:
            timer = StepTimer()
            models[microbatches].fit(data, epochs=1, verbose=0, callbacks=[timer])
            medians[microbatches].append(statistics.median(timer.times))
    step_seconds = {m: statistics.median(v) for m, v in medians.items()}
    for microbatches, (measured, bound, ratio) in speedups(step_seconds).items():
        print(f"M={microbatches}: step {step_seconds[microbatches] * 1e3:.2f} ms, "
              f"speedup {measured:.3f}, GPipe bound {bound:.3f} (idle share "
              f"{bubble_fraction(microbatches, STAGES):.2f}), measured/bound {ratio:.3f}")
    if args.profile:
        phases = {m: profile_matmuls(models[m], data) for m in MICROBATCHES}
        for microbatches, phase in phases.items():
            print(f"M={microbatches}: MatMul time per step (profiled): forward "
                  f"{phase['forward'] * 1e3:.1f} ms, backward {phase['backward'] * 1e3:.1f} ms "
                  f"({phase['backward'] / phases[1]['backward']:.3f} x M=1's)")
    print(f"efficiency={speedups(step_seconds)[4][2]:.3f}", flush=True)


if __name__ == "__main__":
    main()

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

The schedules (``model_parallel.schedule``): GPipe and 1F1B are timed side by
side at M = 4 and 8 in the same rounds. ``schedule_efficiency`` is the step
time the measured stage times allow, ``(M + K - 1)`` x the slowest stage's
busy time per microbatch (its forward and backward ops, from the profile),
over the step time measured in the same profiled steps: it separates the
schedule from the kernels' small-batch cost. ``memory_ratio_1f1b`` is 1F1B's
peak allocator bytes above the step's start over GPipe's at M=8, read from
TensorFlow's CPU allocator (``tf.config.experimental.get_memory_info``) for
the same stage layout at a batch whose activations outweigh the weights
(``--memory-batch`` x ``--memory-units``); ``step_ratio_1f1b`` is 1F1B's
step time over GPipe's at M=8. The last lines are ``name=value``.

    python benchmarks/pipeline.py [--rounds 5] [--units 1024] [--batch 512] [--no-profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

STAGES = 2
MICROBATCHES = (1, 2, 4, 8)
SCHEDULED = (4, 8)  # the M at which GPipe and 1F1B are compared
VARIANTS = tuple((m, "gpipe") for m in MICROBATCHES) + tuple((m, "1f1b") for m in SCHEDULED)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds.")
    parser.add_argument("--steps", type=int, default=12, help="Timed steps per round.")
    parser.add_argument("--units", type=int, default=1024, help="Width of every Dense layer.")
    parser.add_argument("--layers", type=int, default=3, help="Dense layers per stage.")
    parser.add_argument("--batch", type=int, default=512, help="Batch size.")
    parser.add_argument("--memory-batch", type=int, default=4096,
                        help="Batch of the memory comparison.")
    parser.add_argument("--memory-units", type=int, default=256,
                        help="Width of the memory comparison's Dense layers.")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                        help="Also profile MatMul time per phase for each M.")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "units", "layers", "batch", "memory_batch", "memory_units"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    for name in ("batch", "memory_batch"):
        if getattr(args, name) % max(MICROBATCHES):
            parser.error(f"--{name.replace('_', '-')} must be a multiple of "
                         f"{max(MICROBATCHES)}. Received: {getattr(args, name)}.")
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


def schedule_efficiency(microbatches: int, stage_seconds: Mapping[int, float],
                        step_seconds: float) -> float:
    """``(M + K - 1)`` x the slowest stage's seconds per microbatch over the step's seconds."""
    from hybridpar.parallel.schedule import scheduled_step_seconds

    slowest = max(stage_seconds.values())
    return scheduled_step_seconds(microbatches, STAGES, slowest) / step_seconds


def step_timer() -> Any:
    """A Keras callback recording each step's seconds (``.times``), after the first step
    of a ``fit`` call (Keras is imported only once the devices are set up)."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.times: list[float] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch > 0:  # the first step of a fit call includes its set-up
                self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def profile(model: Any, data: Any, microbatches: int, steps: int = 3) -> dict[str, Any]:
    """Over ``steps`` profiled steps of ``model.fit`` (the first one untimed): MatMul
    seconds per step by phase, each stage's busy seconds per microbatch, the step time."""
    import tempfile

    import tensorflow as tf

    from hybridpar.parallel.schedule import stage_seconds_per_microbatch
    from hybridpar.parallel.timeline import profiled_ops

    model.fit(data.take(1), epochs=1, verbose=0)  # the traced function is warm
    timer = step_timer()
    with tempfile.TemporaryDirectory(prefix="pipeline-profile-") as trace_dir:
        tf.profiler.experimental.start(trace_dir)
        model.fit(data.take(steps), epochs=1, verbose=0, callbacks=[timer])
        tf.profiler.experimental.stop()
        ops = profiled_ops(trace_dir)
    return {"matmuls": matmul_phases(ops, steps),
            "stages": stage_seconds_per_microbatch(ops, steps, microbatches),
            "step": statistics.median(timer.times)}


def build(microbatches: int, args: argparse.Namespace, schedule: str = "gpipe",
          batch: int | None = None, units: int | None = None) -> Any:
    import keras

    import hybridpar

    units = units or args.units
    config = {
        "data_parallel": {"mode": "none"},
        "model_parallel": {"stages": STAGES, "microbatches": microbatches, "schedule": schedule,
                           "placement": {"^stage0_": 0, "^stage1_": 1}},
        "data": {"global_batch_size": batch or args.batch},
    }
    keras.utils.set_random_seed(0)
    with hybridpar.scope(config):
        inputs = keras.Input((units,))
        x = inputs
        for stage in range(STAGES):
            for layer in range(args.layers):
                x = keras.layers.Dense(units, activation="relu",
                                       name=f"stage{stage}_dense{layer}")(x)
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    return model


def peak_bytes(args: argparse.Namespace, schedule: str, steps: int = 3) -> int:
    """The median over ``steps`` steps of the CPU allocator's peak bytes above the step's
    start, for M=8 under ``schedule`` on the memory comparison's model."""
    import numpy as np
    import tensorflow as tf

    model = build(max(SCHEDULED), args, schedule, args.memory_batch, args.memory_units)
    x = np.random.default_rng(0).standard_normal(
        (args.memory_batch, args.memory_units)).astype(np.float32)
    data = tf.data.Dataset.from_tensors((x, np.tanh(x)))
    model.fit(data, epochs=1, verbose=0)  # traced, optimizer state created
    peaks = []
    for _ in range(steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        start = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.fit(data, epochs=1, verbose=0)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - start)
    return int(statistics.median(peaks))


def time_rounds(models: Mapping[tuple[int, str], Any], data: Any,
                args: argparse.Namespace) -> dict[tuple[int, str], float]:
    """Each variant's median step seconds over interleaved rounds (the order rotates)."""
    medians: dict[tuple[int, str], list[float]] = {v: [] for v in VARIANTS}
    for round_index in range(args.rounds):
        shift = round_index % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            timer = step_timer()
            models[variant].fit(data, epochs=1, verbose=0, callbacks=[timer])
            medians[variant].append(statistics.median(timer.times))
    return {v: statistics.median(times) for v, times in medians.items()}


def report_profiles(models: Mapping[tuple[int, str], Any], data: Any) -> float:
    """Prints the MatMul phases and the schedule efficiency; returns the worst efficiency."""
    profiles = {v: profile(models[v], data, v[0]) for v in VARIANTS}
    base = profiles[1, "gpipe"]["matmuls"]["backward"]
    for (microbatches, schedule), result in profiles.items():
        phase = result["matmuls"]
        print(f"M={microbatches} {schedule}: MatMul time per step (profiled): forward "
              f"{phase['forward'] * 1e3:.1f} ms, backward {phase['backward'] * 1e3:.1f} ms "
              f"({phase['backward'] / base:.3f} x M=1's)")
    worst = float("inf")
    for (microbatches, schedule), result in profiles.items():
        if microbatches not in SCHEDULED:
            continue
        stages = ", ".join(f"stage {k} {t * 1e3:.2f} ms" for k, t in result["stages"].items())
        efficiency = schedule_efficiency(microbatches, result["stages"], result["step"])
        worst = min(worst, efficiency)
        print(f"M={microbatches} {schedule}: busy per microbatch {stages}; profiled step "
              f"{result['step'] * 1e3:.2f} ms; schedule efficiency {efficiency:.3f}")
    return worst


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Peak bytes (get_memory_info) are kept only by TensorFlow's BFC CPU allocator.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
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
    models = {(m, schedule): build(m, args, schedule) for m, schedule in VARIANTS}
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: {STAGES} stages x "
          f"{args.layers} Dense({args.units}) on 2 logical CPUs (1 intra-op thread each), "
          f"batch {args.batch}, {args.rounds} rounds x {args.steps} steps", flush=True)
    step_seconds = time_rounds(models, data, args)
    gpipe = {m: step_seconds[m, "gpipe"] for m in MICROBATCHES}
    for microbatches, (measured, bound, ratio) in speedups(gpipe).items():
        print(f"M={microbatches}: step {gpipe[microbatches] * 1e3:.2f} ms, "
              f"speedup {measured:.3f}, GPipe bound {bound:.3f} (idle share "
              f"{bubble_fraction(microbatches, STAGES):.2f}), measured/bound {ratio:.3f}")
    for microbatches in SCHEDULED:
        print(f"M={microbatches}: 1F1B step {step_seconds[microbatches, '1f1b'] * 1e3:.2f} ms, "
              f"{step_seconds[microbatches, '1f1b'] / gpipe[microbatches]:.3f} x GPipe's")
    efficiency = report_profiles(models, data) if args.profile else None
    peaks = {schedule: peak_bytes(args, schedule) for schedule in ("gpipe", "1f1b")}
    print(f"M=8 peak allocator bytes above the step's start (batch {args.memory_batch}, "
          f"Dense({args.memory_units})): GPipe {peaks['gpipe'] / 1e6:.1f} MB, "
          f"1F1B {peaks['1f1b'] / 1e6:.1f} MB")
    print(f"efficiency={speedups(gpipe)[4][2]:.3f}")
    if efficiency is not None:
        print(f"schedule_efficiency={efficiency:.3f}")
    ratio = peaks["1f1b"] / peaks["gpipe"] if peaks["gpipe"] else float("nan")
    print(f"memory_ratio_1f1b={ratio:.3f}")
    print(f"step_ratio_1f1b={step_seconds[8, '1f1b'] / gpipe[8]:.3f}", flush=True)


if __name__ == "__main__":
    main()

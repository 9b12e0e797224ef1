"""Checkpoint throughput and recovery time: save/restore MB/s, kill -> first resumed step.

Part 1 (in this process, one device): an MLP with Adam is saved with
``hybridpar.checkpoint.save`` (capture, write, SHA-256, fsync, atomic rename) and
restored with ``hybridpar.checkpoint.restore`` (verify the checksum, read, assign),
``--repeats`` times each, side by side with Keras's ``model.save_weights`` /
``load_weights`` of the same model (weights and optimizer in one .h5; no manifest,
checksum or fsync). MB are the bytes of the files written (10^6 bytes), per second of
median wall time. ``read_ahead_share`` is the part of that restore spent reading every
tensor to check its CRC32C before restoring (``files.verify(deep=True)``, timed on its
own): what a resume in one process no longer does (it checks each tensor as it reads it).

Part 1b (one device, in ``model.fit``): ``PeriodicCheckpoint`` saves every
``--every_steps`` steps; each save blocks the step loop only while it copies
the values to host memory, and the files are written in a background thread.
At each save step, once that write has finished, the same model is saved
with Keras's ``save_weights`` in the same step. ``blocking_ratio`` is the
median time a save blocked the loop over the median ``save_weights`` time
(target <= 0.3).

Part 2 (real processes): ``hybridpar launch --workers 2 --max-restarts 1`` runs this
script as the training job (``--child``); worker:1 sends itself SIGKILL (then, in a
second cluster, SIGTERM) after step ``--die_at``. Each child prints JSON event lines
with wall-clock times; the parent reports the time from the signal to the first
optimizer step trained after the restart, split into stages (see ``recovery_times``).

    python benchmarks/checkpoint.py [--units 1024] [--repeats 5]

The last lines are ``blocking_ratio=<x>`` and ``kill_to_first_resumed_step_s=<seconds>``
(the latter not with ``--skip_recovery``).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EVENT_PREFIX = "CKPT_BENCH "
CHILD_TIMEOUT_S = 400


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1024, help="Units of the 2 hidden layers.")
    parser.add_argument("--features", type=int, default=256, help="Input features.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed saves and restores.")
    parser.add_argument("--die_at", type=int, default=25, help="Step after which worker:1 dies.")
    parser.add_argument("--every_steps", type=int, default=10, help="checkpoint.every_steps")
    parser.add_argument("--skip_recovery", action="store_true", help="Part 1 only.")
    parser.add_argument("--child", choices=["KILL", "TERM"], help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("units", "features", "repeats", "die_at", "every_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    return args


def mb_per_s(nbytes: int, seconds: float) -> float:
    """Throughput in MB (10^6 bytes) per second."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive. Received: {seconds}.")
    return nbytes / 1e6 / seconds


def event_line(event: str, **fields: Any) -> str:
    """One line a child prints: the prefix, then JSON with the event and the wall time."""
    return EVENT_PREFIX + json.dumps({"event": event, "time": time.time(), **fields})


def parse_events(output: str) -> list[dict[str, Any]]:
    """The events in the launcher's output, each with its ``task`` (``worker:1``) added."""
    events = []
    for line in output.splitlines():
        task = ""
        if line.startswith("[") and "] " in line:
            task, line = line[1:].split("] ", 1)
        if line.startswith(EVENT_PREFIX):
            events.append({**json.loads(line[len(EVENT_PREFIX):]), "task": task})
    return events


def recovery_times(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds from the signal to each stage of the restarted run (its slowest worker).

    Stages: the first run's processes exit (``exit``, after saving on SIGTERM; the
    SIGKILLed worker prints none); the restarted processes start (``process``); they
    have imported TensorFlow and joined the cluster (``ready``); restored the
    checkpoint (``restored``); trained their first step (``first_step``).

    Raises:
        ValueError: naming the event that is missing.
    """
    def times(name: str, run: int) -> list[float]:
        found = [e["time"] for e in events if e["event"] == name and e["run"] == run]
        if not found:
            raise ValueError(f"no {name!r} event of run {run} in the output; got "
                             f"{sorted({(e['event'], e['run']) for e in events})}")
        return found

    signal_time = times("signal", 0)[0]
    exited = [e["time"] for e in events if e["event"] == "exit" and e["run"] == 0]
    stages = {
        "exit": max(exited) if exited else signal_time,
        "process": max(times("process", 1)),
        "ready": max(times("ready", 1)),
        "restored": max(times("restored", 1)),
        "first_step": max(times("first_step", 1)),
    }
    result, previous = {}, ("signal", signal_time)
    for name, moment in stages.items():
        result[f"{previous[0]}_to_{name}_s"] = moment - previous[1]
        previous = (name, moment)
    result["signal_to_first_resumed_step_s"] = stages["first_step"] - signal_time
    return result


# --------------------------------------------------------------------------- part 1


def build_model(units: int, features: int):
    import keras

    model = keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def timed(function, *args: Any) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def throughput(args: argparse.Namespace) -> dict[str, float]:
    """Median MB/s of hybridpar and Keras saves and restores, side by side."""
    import hybridpar
    from hybridpar.checkpoint import files

    model = build_model(args.units, args.features)
    root = Path(tempfile.mkdtemp(prefix="hybridpar-ckpt-bench-"))
    read_ahead: list[float] = []  # reading every tensor to check it, as a choice may
    try:
        times: dict[str, list[float]] = {k: [] for k in ("save", "restore", "keras_save",
                                                         "keras_restore")}
        sizes = {}
        for repeat in range(args.repeats):
            directory = root / f"h{repeat}"
            model.optimizer.iterations.assign(repeat + 1)
            times["save"].append(timed(hybridpar.checkpoint.save, model, directory))
            sizes["save"] = sum(p.stat().st_size for p in directory.glob("*/*"))
            times["restore"].append(timed(hybridpar.checkpoint.restore, model, directory))
            checkpoint = next(directory.glob("ckpt-*"))
            read_ahead.append(timed(functools.partial(files.verify, checkpoint, deep=True)))
            weights = root / f"k{repeat}.weights.h5"
            times["keras_save"].append(timed(model.save_weights, weights))
            sizes["keras_save"] = weights.stat().st_size
            times["keras_restore"].append(timed(model.load_weights, weights))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sizes["restore"], sizes["keras_restore"] = sizes["save"], sizes["keras_save"]
    return {
        **{f"{k}_mb": sizes[k] / 1e6 for k in ("save", "keras_save")},
        **{f"{k}_mb_per_s": mb_per_s(sizes[k], statistics.median(v)) for k, v in times.items()},
        "restore_s": statistics.median(times["restore"]),
        "read_ahead_s": statistics.median(read_ahead),
    }


def blocking(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds a ``PeriodicCheckpoint`` save blocked ``fit``, and Keras's save_weights."""
    import keras
    import numpy as np

    import hybridpar

    root = Path(tempfile.mkdtemp(prefix="hybridpar-ckpt-blocking-"))
    blocked: list[float] = []
    keras_saves: list[float] = []
    config = {"data_parallel": {"mode": "none"},
              "checkpoint": {"dir": str(root / "ckpt"), "every_steps": args.every_steps,
                             "every_epochs": None, "keep": 2}}
    try:
        with hybridpar.scope(config) as hs:
            model = build_model(args.units, args.features)
            checkpoint = hs.callbacks()[0]
        save = checkpoint.save

        def timed_save(*save_args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            path = save(*save_args, **kwargs)
            blocked.append(time.perf_counter() - started)
            return path

        checkpoint.save = timed_save

        class KerasSaves(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if len(blocked) > len(keras_saves):  # this step saved
                    checkpoint.writer.wait()  # the background write is done (not timed)
                    keras_saves.append(timed(model.save_weights, root / "k.weights.h5"))

        steps = args.every_steps * (args.repeats + 1)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64 * steps, args.features)).astype("float32")
        y = rng.normal(size=(64 * steps, 10)).astype("float32")
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False,
                  callbacks=[checkpoint, KerasSaves()])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"blocked_s": statistics.median(blocked[1:] or blocked),
            "keras_save_s": statistics.median(keras_saves[1:] or keras_saves),
            "saves": len(blocked)}


# --------------------------------------------------------------------------- part 2


def run_child(args: argparse.Namespace) -> None:
    """The training job each worker runs; prints events, dies on request (first run only)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import hybridpar

    run = int(os.environ.get("HYBRIDPAR_RESTART", "0"))
    task = os.environ.get("HYBRIDPAR_TASK", "single")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * 40, args.features)).astype("float32")
    y = rng.normal(size=(64 * 40, 10)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    config = {"data": {"global_batch_size": 64, "shard_policy": "data"},
              "checkpoint": {"dir": args.ckpt, "every_steps": args.every_steps, "keep": 2}}
    with hybridpar.scope(config) as hs:
        model = build_model(args.units, args.features)
        callbacks = hs.callbacks()
    print(event_line("ready", run=run), flush=True)

    class Events(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.stepped = False

        def on_train_begin(self, logs: Any = None) -> None:
            step = int(self.model.optimizer.iterations.numpy())
            print(event_line("restored", run=run, step=step), flush=True)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = int(self.model.optimizer.iterations.numpy())
            if logs and not self.stepped:
                self.stepped = True
                print(event_line("first_step", run=run, step=step), flush=True)
            if run == 0 and task == "worker:1" and step == args.die_at:
                print(event_line("signal", run=run, signal=args.child), flush=True)
                os.kill(os.getpid(), getattr(__import__("signal"), f"SIG{args.child}"))

    model.fit(data, epochs=2, verbose=0, shuffle=False, callbacks=[*callbacks, Events()])


def recovery(signal_name: str, args: argparse.Namespace) -> dict[str, float]:
    """Runs a 2-worker cluster whose worker:1 gets ``signal_name``; returns recovery times."""
    ckpt = Path(tempfile.mkdtemp(prefix="hybridpar-ckpt-bench-"))
    try:
        command = [sys.executable, os.path.abspath(__file__), "--child", signal_name,
                   "--ckpt", str(ckpt), "--units", str(args.units), "--features",
                   str(args.features), "--die_at", str(args.die_at), "--every_steps",
                   str(args.every_steps)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("TF_CONFIG", None)
        result = subprocess.run(
            [sys.executable, "-m", "hybridpar.launch", "--workers", "2", "--max-restarts", "1",
             "--grace", "2", "--", *command],
            capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S,
        )
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"the {signal_name} cluster failed ({result.returncode}): "
                           f"{result.stderr[-2000:]}")
    return recovery_times(parse_events(result.stdout))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        run = int(os.environ.get("HYBRIDPAR_RESTART", "0"))
        print(event_line("process", run=run), flush=True)
        atexit.register(lambda: print(event_line("exit", run=run), flush=True))
        run_child(args)
        return
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, CPU; MLP "
          f"{args.features}-{args.units}-{args.units}-10 with Adam; {args.repeats} repeats")
    result = throughput(args)
    print(f"hybridpar checkpoint ({result['save_mb']:.1f} MB: weights, Adam slots, manifest): "
          f"save {result['save_mb_per_s']:.0f} MB/s, restore {result['restore_mb_per_s']:.0f} "
          f"MB/s (medians)")
    print(f"keras save_weights ({result['keras_save_mb']:.1f} MB: weights, Adam slots): save "
          f"{result['keras_save_mb_per_s']:.0f} MB/s, load {result['keras_restore_mb_per_s']:.0f}"
          f" MB/s (medians)")
    print(f"save_ratio={result['save_mb_per_s'] / result['keras_save_mb_per_s']:.2f} "
          f"restore_ratio={result['restore_mb_per_s'] / result['keras_restore_mb_per_s']:.2f} "
          "(hybridpar MB/s over Keras MB/s)")
    print(f"read-ahead check (every tensor read for its CRC32C, as hybridpar.checkpoint.restore "
          f"and a multi-worker resume's choice do; a resume in one process does not): "
          f"{result['read_ahead_s']:.3f} s of a {result['restore_s']:.3f} s restore (medians)")
    print(f"read_ahead_share={result['read_ahead_s'] / result['restore_s']:.2f}")
    block = blocking(args)
    print(f"PeriodicCheckpoint in fit (every {args.every_steps} steps, {block['saves']} saves, "
          f"the first one left out): the loop blocked {block['blocked_s'] * 1e3:.1f} ms per "
          f"save (snapshot of the variables; write, SHA-256, fsync and rename in the background); "
          f"keras save_weights of the same model {block['keras_save_s'] * 1e3:.1f} ms (medians)")
    print(f"blocking_ratio={block['blocked_s'] / block['keras_save_s']:.3f}", flush=True)
    if args.skip_recovery:
        return
    times = {}
    for signal_name in ("TERM", "KILL"):
        times[signal_name] = recovery(signal_name, args)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in times[signal_name].items())
        print(f"2 workers, SIG{signal_name} to worker:1 after step {args.die_at} "
              f"(every_steps={args.every_steps}): {parts}")
    print(f"kill_to_first_resumed_step_s={times['KILL']['signal_to_first_resumed_step_s']:.2f}")


if __name__ == "__main__":
    main()

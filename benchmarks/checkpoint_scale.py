"""Checkpoints of a parameter-server table: chief memory, save/restore time, resume cost.

A real cluster on localhost (``hybridpar launch --workers 1 --ps 2``; every task runs
this script with ``--child``; the worker and ps tasks serve). The chief builds an
``Embedding`` of ``--rows`` x ``--dim`` float32 (default 4,194,304 x 64 = 1.07 GB)
sharded over both ps with ``FixedShardsPartitioner(2)``, and Adam's slots (one set per
shard, each on its shard's ps), then:

- saves it ``--repeats`` times with ``hybridpar.checkpoint.save`` (snapshot on the ps,
  each ps writes its own data file, the chief merges the index, hashes it and writes
  the manifest) and restores it with ``hybridpar.checkpoint.restore`` (each ps reads
  its own rows), side by side with a bare ``tf.train.Checkpoint`` of the same
  variables (``write`` / ``read``), the two taking turns at going first, each
  call after an ``os.sync()`` (so none writes back the dirty pages of the one
  before). A thread samples the chief's resident memory (``VmRSS``) every 5 ms;
  the memory a save or restore adds is its peak minus the value before it.
- resumes ``fit`` (``PeriodicCheckpoint``) from a checkpoint at step 100 and from one
  at step 10,000 of a 20,000-step epoch and times ``fit``'s start to the end of the
  first trained step, in this chief process (the restore included).

    python benchmarks/checkpoint_scale.py [--rows 4194304] [--dim 64] [--repeats 4]

The last lines are ``chief_save_memory_ratio=`` and ``chief_restore_memory_ratio=``
(added memory / table bytes; target <= 0.25), ``save_time_ratio=`` (median hybridpar
save / median bare save; target <= 1.1; restore is reported beside it) and
``resume_step_cost_ratio=`` (step 10,000 / step 100; target <= 1.2).
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
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "SCALE_BENCH "
RESUME_STEPS = (100, 10_000)
EPOCH_STEPS = 20_000


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_194_304, help="Rows of the table.")
    parser.add_argument("--dim", type=int, default=64, help="Columns of the table.")
    parser.add_argument("--repeats", type=int, default=4, help="Timed saves and restores.")
    parser.add_argument("--timeout", type=int, default=3000, help="Cluster timeout (s).")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work_dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rows", "dim", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive. Received: {getattr(args, name)}")
    return args


def ratio(numerator: float, denominator: float) -> float:
    if denominator <= 0:
        raise ValueError(f"the denominator must be positive. Received: {denominator}")
    return numerator / denominator


def spread(seconds: Sequence[float]) -> str:
    """``1.20-1.90 s``: the fastest and slowest of some timings."""
    return f"{min(seconds):.2f}-{max(seconds):.2f} s"


def summary(result: dict[str, Any]) -> list[str]:
    """The report's lines, the four ratios last."""
    table = result["table_bytes"]
    lines = [f"table: {result['rows']} x {result['dim']} float32 = {table / 1e6:.0f} MB over "
             f"2 ps (+ Adam's 2 slots: {3 * table / 1e6:.0f} MB of state)"]
    for kind in ("save", "restore"):
        ours, bare = statistics.median(result[kind]), statistics.median(result[f"bare_{kind}"])
        lines.append(f"{kind}: hybridpar {ours:.2f} s, bare tf.train.Checkpoint {bare:.2f} s "
                     f"(ratio {ratio(ours, bare):.2f}; runs {spread(result[kind])} and "
                     f"{spread(result[f'bare_{kind}'])}); chief memory added "
                     f"{result[f'{kind}_memory'] / 1e6:.0f} MB (bare: "
                     f"{result[f'bare_{kind}_memory'] / 1e6:.0f} MB)")
    low, high = (result["resume"][str(s)] for s in RESUME_STEPS)
    lines.append(f"fit start -> first trained step: {low:.2f} s at step {RESUME_STEPS[0]}, "
                 f"{high:.2f} s at step {RESUME_STEPS[1]}")
    lines += [
        f"chief_save_memory_ratio={ratio(result['save_memory'], table):.3f}",
        f"chief_restore_memory_ratio={ratio(result['restore_memory'], table):.3f}",
        f"save_time_ratio={ratio(statistics.median(result['save']), statistics.median(result['bare_save'])):.3f}",  # noqa: E501
        f"resume_step_cost_ratio={ratio(high, low):.3f}",
    ]
    return lines


def call_order(repeat: int) -> list[str]:
    """The timed calls of one repeat: each save before its restore, and hybridpar's
    and the bare calls taking turns at going first (a machine's state, such as
    its page cache, then favours neither)."""
    pair = [("save", "restore"), ("bare_save", "bare_restore")]
    first, second = pair if repeat % 2 else pair[::-1]
    return [first[0], second[0], first[1], second[1]]


def parse_result(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        _, sep, payload = line.partition(RESULT_PREFIX)
        if sep:
            return json.loads(payload)
    raise ValueError(f"the chief printed no {RESULT_PREFIX.strip()} line")


# --------------------------------------------------------------------------- the chief


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured(function: Callable[[], Any]) -> tuple[float, int]:
    """``(seconds, peak resident bytes added)`` of ``function()``."""
    before, peak, done = resident_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    function()
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    return seconds, max(peak[0], resident_bytes()) - before


def child(args: argparse.Namespace) -> None:
    import keras
    import tensorflow as tf

    import hybridpar
    from hybridpar.checkpoint import model_state

    work = Path(args.work_dir)
    ours = work / "ours"  # checkpoint.dir: the ps write their data files there
    config = {"data_parallel": {"mode": "parameter_server"},
              "parameter_server": {"partitioner": {"kind": "fixed", "shards": 2}},
              "data": {"global_batch_size": 64},
              "checkpoint": {"dir": str(ours), "every_epochs": 1000, "keep": 10}}
    with hybridpar.scope(config) as hs:  # worker and ps tasks serve here
        model = keras.Sequential([
            keras.Input((4,), dtype="int64"),
            keras.layers.Embedding(args.rows, args.dim, embeddings_initializer="zeros"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    model_state.ensure_built(model)
    variables = [s for v in model.variables + model.optimizer.variables
                 for s in getattr(v.value, "variables", [v.value])]
    bare = tf.train.Checkpoint(variables=variables)
    result: dict[str, Any] = {"rows": args.rows, "dim": args.dim,
                              "table_bytes": args.rows * args.dim * 4}
    for kind in ("save", "restore", "bare_save", "bare_restore"):
        result[kind], result[f"{kind}_memory"] = [], 0
    for repeat in range(args.repeats):
        model.optimizer.iterations.assign(repeat + 1)  # a new checkpoint name each time
        prefix, saved = str(work / f"bare-{repeat}" / "ckpt"), ours / f"ckpt-{repeat + 1:08d}"
        calls = {"bare_save": lambda p=prefix: bare.write(p),
                 "save": lambda: hybridpar.checkpoint.save(model, ours),
                 "bare_restore": lambda p=prefix: bare.read(p),
                 "restore": lambda s=saved: hybridpar.checkpoint.restore(model, s)}
        for kind in call_order(repeat):
            os.sync()  # the previous call's dirty pages are not this call's to write back
            seconds, added = measured(calls[kind])
            result[kind].append(seconds)
            result[f"{kind}_memory"] = max(result[f"{kind}_memory"], added)
        shutil.rmtree(saved)
        shutil.rmtree(work / f"bare-{repeat}")
    result["resume"] = {str(step): resume_cost(model, hs, ours, step) for step in RESUME_STEPS}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def resume_cost(model: Any, hs: Any, directory: Path, step: int) -> float:
    """Seconds from ``fit``'s start to the end of its first step, resuming at ``step``
    (the newest checkpoint in ``directory`` afterwards)."""
    import keras
    import tensorflow as tf

    import hybridpar

    model.optimizer.iterations.assign(step)
    data = {"epoch": 0, "batch": step, "iterator_position": step, "iterator_persists": False,
            "steps_per_epoch": EPOCH_STEPS}
    hybridpar.checkpoint.save_position(model, directory, data)
    config = hs.state.config  # checkpoint.every_epochs: 1000, so no save at the epoch's end
    rows = model.layers[0].input_dim

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        ids = tf.random.stateless_uniform((256, 4), (1, 2), maxval=rows, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((ids, tf.zeros((256, 1)))).batch(64).repeat()

    class FirstStep(keras.callbacks.Callback):
        """Stops after the first step: the loop joins it before its batch ends."""

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.model.stop_training = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.seen = time.perf_counter()

    first = FirstStep()
    start = time.perf_counter()
    model.fit(dataset_fn, epochs=1, steps_per_epoch=EPOCH_STEPS, verbose=0,
              callbacks=[*hybridpar.callbacks.defaults(config, hs), first])
    return first.seen - start


# --------------------------------------------------------------------------- the parent


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    work = tempfile.mkdtemp(prefix="hybridpar-checkpoint-scale-")
    try:
        command = [sys.executable, "-m", "hybridpar.launch", "--workers", "1", "--ps", "2",
                   "--timeout", str(args.timeout), "--", sys.executable, __file__, "--child",
                   "--work_dir", work, "--rows", str(args.rows), "--dim", str(args.dim),
                   "--repeats", str(args.repeats)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("TF_CONFIG", None)
        run = subprocess.run(command, capture_output=True, text=True, env=env,
                             timeout=args.timeout + 120)
        if run.returncode != 0:
            sys.stderr.write(run.stderr[-6000:])
            raise SystemExit(f"the cluster failed with {run.returncode}")
        for line in summary(parse_result(run.stdout)):
            print(line)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

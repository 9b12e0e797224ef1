"""Memory per device and step time of model-parallel placement.

Two measurements on 4 logical CPU devices, with the same seeded transformer
(``hybridpar_models`` digits_transformer, 4 blocks) and Adam:

* ``memory``: bytes of weights + optimizer state on each device for 1 x 4
  (pure model parallel, one block per stage) and 4 x 1 (plain data
  parallel). Prints ``memory_ratio=<max bytes on a device, 1x4 / 4x1>``
  (about 1/4 when the model splits evenly; the embedding and head add to
  the first and last stage).
* ``steps``: median ``model.fit`` step time of the 2 x 2 hybrid against
  plain mirrored 4 x 1 over the same 4 devices and global batch, in
  interleaved child processes. Prints ``step_ratio=<hybrid / mirrored>``.

    python benchmarks/placement.py [--part memory|steps|both] [--pairs 5]

The last line is the step ratio (or the memory ratio with ``--part memory``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

DEVICES = 4
SEED = 1234
CHILD_TIMEOUT_S = 600
LAYOUTS = {
    "1x4": {
        "data_parallel": {"mode": "none"},
        "model_parallel": {
            "stages": 4,
            "placement": {"^(embed|block_0)$": 0, "^block_1$": 1, "^block_2$": 2,
                          "^(block_3|head.*)$": 3},
        },
    },
    "4x1": {"data_parallel": {"mode": "mirrored"}},
    "2x2": {
        "data_parallel": {"mode": "mirrored"},
        "model_parallel": {
            "stages": 2,
            "placement": {"^(embed|block_[01])$": 0, "^(block_[23]|head.*)$": 1},
        },
    },
}
STEP_VARIANTS = ("2x2", "4x1")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line (the parent forwards its sizes to the children)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("memory", "steps", "both"), default="both")
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs of step-time runs.")
    parser.add_argument("--dim", type=int, default=128, help="Transformer width.")
    parser.add_argument("--batch", type=int, default=128, help="Global batch size.")
    parser.add_argument("--steps", type=int, default=30, help="Timed steps per child.")
    parser.add_argument("--child", choices=tuple(LAYOUTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("pairs", "dim", "batch", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    if args.batch % DEVICES or args.dim % 4:
        parser.error(
            f"--batch must be a multiple of {DEVICES} and --dim of 4 (attention heads). "
            f"Received: --batch={args.batch} --dim={args.dim}."
        )
    return args


def memory_ratio(per_device: Mapping[str, Mapping[str, int]]) -> float:
    """Largest per-device footprint of layout ``1x4`` over that of ``4x1``."""
    return max(per_device["1x4"].values()) / max(per_device["4x1"].values())


def build_and_step(layout: str, args: argparse.Namespace, steps: int) -> dict[str, Any]:
    """Builds the model under ``layout``, trains ``steps`` timed steps (after one
    warm-up step) and returns its footprint per device and step times."""
    import hybridpar_models
    import keras
    import numpy as np

    import hybridpar

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.uniform(0, 255, size=(args.batch * (steps + 1), 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, size=(len(x),)).astype("int32")
    config = {**LAYOUTS[layout], "data": {"global_batch_size": args.batch}}
    with hybridpar.scope(config) as hs:
        model = hybridpar_models.get("digits_transformer")(blocks=4, dim=args.dim)
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times: list[float] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch > 0:
                times.append(time.perf_counter() - self._start)

    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
              callbacks=[StepTimer()])
    report = hs.describe(model)
    return {
        "layout": layout,
        "bytes": {d: report.device_bytes(d) for d in report.mesh.devices},
        "median_step_s": statistics.median(times) if times else None,
        "params": model.count_params(),
    }


def run_child(args: argparse.Namespace) -> None:
    import hybridpar

    hybridpar.testing.use_logical_cpus(DEVICES, intra_op_threads=1)
    print(json.dumps(build_and_step(args.child, args, args.steps)), flush=True)


def spawn(layout: str, args: argparse.Namespace, steps: int) -> dict[str, Any]:
    """Runs one child process and returns its record.

    Raises:
        RuntimeError: with the child's stderr tail if it fails.
    """
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={layout}",
           f"--dim={args.dim}", f"--batch={args.batch}", f"--steps={steps}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"Child {layout} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_memory(args: argparse.Namespace) -> float:
    per_device = {}
    for layout in ("1x4", "4x1"):
        record = spawn(layout, args, steps=1)
        per_device[layout] = record["bytes"]
        shown = ", ".join(f"{d[-5:]}={b / 1e6:.3f} MB" for d, b in record["bytes"].items())
        print(f"{layout}: weights + Adam state per device: {shown} ({record['params']:,} params)")
    ratio = memory_ratio(per_device)
    print(f"memory_ratio={ratio:.3f}", flush=True)
    return ratio


def measure_steps(args: argparse.Namespace) -> float:
    pairs = []
    for i in range(args.pairs):
        order = STEP_VARIANTS if i % 2 == 0 else STEP_VARIANTS[::-1]
        records = {layout: spawn(layout, args, args.steps) for layout in order}
        pairs.append({layout: records[layout]["median_step_s"] for layout in STEP_VARIANTS})
        print(f"pair {i + 1}/{args.pairs}: median step 2x2={pairs[-1]['2x2'] * 1e3:.2f} ms "
              f"4x1={pairs[-1]['4x1'] * 1e3:.2f} ms", flush=True)
    hybrid = statistics.median(p["2x2"] for p in pairs)
    mirrored = statistics.median(p["4x1"] for p in pairs)
    print(f"step_ratio={hybrid / mirrored:.3f}", flush=True)
    return hybrid / mirrored


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return
    print(f"digits_transformer blocks=4 dim={args.dim}, Adam, global batch {args.batch}, "
          f"{DEVICES} logical CPUs with 1 intra-op thread each")
    if args.part in ("memory", "both"):
        measure_memory(args)
    if args.part in ("steps", "both"):
        measure_steps(args)


if __name__ == "__main__":
    main()

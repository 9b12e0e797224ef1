"""ZeRO stage 1 (``data_parallel.shard_optimizer_state``): optimizer memory, step time, wire bytes.

The model is an MLP 256-1024-1024-10 (1.3 M weights, 5.3 MB of float32) trained
with Adam under ``hybridpar.scope`` and the unmodified ``model.fit``, on
synthetic data (global batch 64), sharded and unsharded:

- ``optimizer_memory_ratio=``: the bytes every variable that building,
  compiling and one step of ``fit`` created holds per device, less the model's
  weights (``hybridpar.parallel.held_bytes.created``: the slots, the scalars and
  anything else sharding adds, such as a copy of the weights' shards, which it
  no longer makes), sharded over unsharded, the largest over the 4 mirrored
  replicas (target <= 0.27); ``sgd_momentum_memory_ratio=`` the same for SGD
  with momentum (one slot per weight, target <= 0.30);
- ``step_time_ratio=``: median step time sharded over unsharded on 4 logical
  CPUs, in interleaved pairs (the order alternates), median over pairs
  (target <= 1.10);
- ``step_peak_ratio=``: the CPU allocator's peak bytes above a step's start
  (``tf.config.experimental.get_memory_info``, median of 5 one-step fits per
  run), sharded over unsharded, median over the pairs. Transient memory: the
  gradients and the reduce-scatter's copies of them, which
  ``zero_plan.BUCKET_ELEMENTS`` bounds (not a target of the issue; stage 2's
  question, see docs/modes/sharded-optimizer.md);
- ``wire_bytes_ratio=``: TCP payload of the cluster's sockets per step (``ss``,
  as ``benchmarks/compression.py``) on 2 real workers on localhost, sharded
  over unsharded, median over ``--rounds`` pairs of clusters (target <= 1.05).
  Every cluster's bytes per step are printed: the ``ss`` sampler has once read
  21 B for a run whose rerun read 10.6 MB per step. ``cluster_step_time_ratio=``
  is the chief's median step there, sharded over unsharded (reported, no target).

    python benchmarks/zero.py [--pairs 3] [--steps 20] [--rounds 2] [--no_cluster]
                              [--bucket_elements N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from compression import Wire
from multiworker import parse_task_output

VARIANTS = ("sharded", "unsharded")
SIZES = (256, 1024, 1024, 10)
BATCH = 64
REPLICAS = 4
CLUSTER_TIMEOUT_S = 600


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="Interleaved pairs of runs.")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per run.")
    parser.add_argument("--rounds", type=int, default=2, help="Pairs of 2-worker clusters.")
    parser.add_argument("--no_cluster", action="store_true", help="Skip the 2-worker part.")
    parser.add_argument("--bucket_elements", type=int, default=None,
                        help="ZeRO's bucket cap (default: zero_plan.BUCKET_ELEMENTS), to "
                             "compare step peaks and times.")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.rounds < 1 or args.steps < 2:
        parser.error("--pairs and --rounds must be >= 1, --steps >= 2")
    return args


def pair_orders(pairs: int) -> list[tuple[str, str]]:
    """Run order per pair: ``sharded`` first in even pairs, ``unsharded`` first in odd ones."""
    return [VARIANTS if i % 2 == 0 else VARIANTS[::-1] for i in range(pairs)]


def pair_ratio(pairs: Sequence[dict[str, float]]) -> float:
    """Median over pairs of the sharded figure over the same pair's unsharded one."""
    return statistics.median(p["sharded"] / p["unsharded"] for p in pairs)


def memory_ratio(sharded: dict[str, int], unsharded: dict[str, int]) -> float:
    """The largest per-device ratio of optimizer bytes, sharded over unsharded.

    Raises:
        ValueError: when the two runs held state on different devices.
    """
    if sorted(sharded) != sorted(unsharded):
        raise ValueError(f"devices differ: {sorted(sharded)} against {sorted(unsharded)}")
    return max(sharded[d] / unsharded[d] for d in unsharded)


# --------------------------------------------------------------------------- training


def _data(tf: Any, steps: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 8, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], BATCH * 8)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat().take(steps)


def _model(hybridpar: Any, keras: Any, config: dict, optimizer: str = "adam"
           ) -> tuple[Any, Any]:
    keras.utils.set_random_seed(1)
    with hybridpar.scope(config) as hs:
        model = keras.Sequential(
            [keras.Input((SIZES[0],))]
            + [keras.layers.Dense(units, activation="relu") for units in SIZES[1:-1]]
            + [keras.layers.Dense(SIZES[-1])])
        model.compile(keras.optimizers.Adam(1e-3) if optimizer == "adam" else
                      keras.optimizers.SGD(1e-3, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, hs


def created_bytes(hybridpar: Any, keras: Any, tf: Any, configs: dict[str, dict],
                  optimizer: str) -> dict[str, dict[str, int]]:
    """Per variant, the bytes by device of every variable that building, compiling and one
    step of ``fit`` created, less the model's weights."""
    from hybridpar.parallel import held_bytes

    result, alive = {}, []
    for variant, config in configs.items():
        before = held_bytes.snapshot()
        model, _ = _model(hybridpar, keras, config, optimizer)
        model.fit(_data(tf, 1), epochs=1, verbose=0)
        result[variant] = held_bytes.created(before, less=model.weights)
        alive.append(model)  # the next variant's snapshot must include this one's
    return result


def optimizer_bytes(model: Any, hs: Any) -> dict[str, int]:
    from hybridpar.parallel import held_bytes

    variables = list(model.optimizer.variables)
    if hs.state.zero is not None:
        variables += list(hs.state.zero.state_for(model.optimizer).replica_variables())
    return held_bytes.variable_bytes_by_device(variables)


def _timed_fit(keras: Any, model: Any, data: Any) -> float:
    times: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self._start)

    model.fit(data, epochs=1, verbose=0, callbacks=[Timer()])
    return statistics.median(times[1:])


def _step_peak(tf: Any, model: Any, fits: int = 5) -> float:
    """The median over ``fits`` one-step fits of the allocator's peak above the start."""
    peaks = []
    for _ in range(fits):
        tf.config.experimental.reset_memory_stats("CPU:0")
        start = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.fit(_data(tf, 1), epochs=1, verbose=0)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - start)
    return statistics.median(peaks)


def run_mirrored(args: argparse.Namespace) -> dict[str, Any]:
    """Memory and interleaved step times on ``REPLICAS`` logical CPUs, in this process."""
    import hybridpar

    hybridpar.testing.use_logical_cpus(REPLICAS)
    import keras
    import tensorflow as tf

    from hybridpar.parallel import zero_plan

    if args.bucket_elements is not None:
        zero_plan.BUCKET_ELEMENTS = args.bucket_elements

    devices = [f"/cpu:{i}" for i in range(REPLICAS)]
    configs = {v: {"data_parallel": {"mode": "mirrored", "devices": devices,
                                     "shard_optimizer_state": v == "sharded"},
                   "data": {"global_batch_size": BATCH}} for v in VARIANTS}
    memory = created_bytes(hybridpar, keras, tf, configs, "adam")
    momentum = created_bytes(hybridpar, keras, tf, configs, "sgd_momentum")
    built = {v: _model(hybridpar, keras, configs[v]) for v in VARIANTS}
    for model, _ in built.values():
        model.fit(_data(tf, 3), epochs=1, verbose=0)  # trace and build before timing
    pairs, peaks = [], []
    for order in pair_orders(args.pairs):
        pairs.append({v: _timed_fit(keras, built[v][0], _data(tf, args.steps)) for v in order})
        peaks.append({v: _step_peak(tf, built[v][0]) for v in order})
    return {"memory": memory, "momentum_memory": momentum, "pairs": pairs, "peaks": peaks,
            "weights": sum(int(v.shape.num_elements()) for v in built["sharded"][0].weights)}


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One task of the 2-worker cluster in TF_CONFIG: bytes on the wire per step."""
    import keras
    import tensorflow as tf

    import hybridpar  # joins the TF_CONFIG cluster before any op runs
    from hybridpar.parallel import zero_plan

    if args.bucket_elements is not None:
        zero_plan.BUCKET_ELEMENTS = args.bucket_elements
    tf_config = json.loads(os.environ["TF_CONFIG"])
    ports = [int(a.rsplit(":", 1)[1]) for a in tf_config["cluster"]["worker"]]
    wire = Wire("ss", ports, tf_config["task"]["index"])
    model, hs = _model(hybridpar, keras, {
        "data_parallel": {"mode": "multi_worker",
                          "shard_optimizer_state": args.child == "sharded"},
        "data": {"global_batch_size": BATCH, "shard_policy": "data"},
        "communication": {"timeout_seconds": 300}})
    model.fit(_data(tf, 3), epochs=1, verbose=0)
    wire.begin()
    step = _timed_fit(keras, model, _data(tf, args.steps))
    wire.end()
    return {"variant": args.child, "wire_bytes": wire.total, "steps": args.steps,
            "median_step_s": step, "optimizer_bytes": optimizer_bytes(model, hs)}


def run_cluster(variant: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import io

    from hybridpar.launch import launch

    command = [sys.executable, os.path.abspath(__file__), f"--child={variant}",
               f"--steps={args.steps}"]
    if args.bucket_elements is not None:
        command.append(f"--bucket_elements={args.bucket_elements}")
    out, err = io.StringIO(), io.StringIO()
    code = launch(command, 2, timeout=CLUSTER_TIMEOUT_S,
                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=out, stderr=err,
                  console="all")
    if code != 0:
        raise RuntimeError(f"cluster {variant} exited with {code}:\n{err.getvalue()[-4000:]}")
    return [parse_task_output(out.getvalue(), f"worker:{i}") for i in range(2)]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Peak bytes (get_memory_info) are kept only by TensorFlow's BFC CPU allocator.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    if args.child:
        print(json.dumps(run_worker(args)), flush=True)
        return
    wire: list[dict[str, float]] = []
    cluster_steps: list[dict[str, float]] = []
    # the clusters first, before this process starts TensorFlow's threads
    for order in [] if args.no_cluster else pair_orders(args.rounds):
        wire.append({})
        cluster_steps.append({})
        for variant in order:
            records = run_cluster(variant, args)
            wire[-1][variant] = sum(r["wire_bytes"] for r in records) / args.steps
            cluster_steps[-1][variant] = records[0]["median_step_s"]
            print(f"{variant}: 2 workers, {wire[-1][variant]:,.0f} B on the wire per step, "
                  f"median step {records[0]['median_step_s'] * 1e3:.1f} ms, optimizer bytes "
                  f"{records[0]['optimizer_bytes']}", flush=True)
    result = run_mirrored(args)
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; MLP "
          f"{'-'.join(map(str, SIZES))} ({result['weights']:,} weights), Adam, global batch "
          f"{BATCH}; {REPLICAS} mirrored logical CPUs, {args.pairs} pair(s) of "
          f"{args.steps} timed steps")
    for variant in VARIANTS:
        print(f"{variant}: optimizer bytes per device {result['memory'][variant]}")
    for i, (pair, peak) in enumerate(zip(result["pairs"], result["peaks"], strict=True)):
        print(f"pair {i}: " + ", ".join(f"{v} {pair[v] * 1e3:.1f} ms, step peak "
                                        f"{peak[v] / 1e6:.2f} MB" for v in pair))
    print(f"optimizer_memory_ratio="
          f"{memory_ratio(result['memory']['sharded'], result['memory']['unsharded']):.4f}")
    momentum = result["momentum_memory"]
    print(f"sgd_momentum_memory_ratio="
          f"{memory_ratio(momentum['sharded'], momentum['unsharded']):.4f}")
    print(f"step_time_ratio={pair_ratio(result['pairs']):.4f}")
    print(f"step_peak_ratio={pair_ratio(result['peaks']):.4f}")
    if wire:
        report_wire(wire, result["weights"])
        print(f"cluster_step_time_ratio={pair_ratio(cluster_steps):.4f}")


def report_wire(rounds: list[dict[str, float]], weights: int) -> None:
    """Prints ``wire_bytes_ratio=`` over the rounds whose samples are plausible.

    A step's all-reduce of float32 gradients over 2 workers moves at least half
    their bytes; a round where ``ss`` read less for either cluster (it has read
    7 B for a run whose rerun read 10.6 MB) measured nothing and is dropped.
    """
    floor = 4 * weights / 2
    valid = [r for r in rounds if min(r.values()) >= floor]
    for dropped in (r for r in rounds if min(r.values()) < floor):
        print(f"round dropped: the sampler read {min(dropped.values()):,.0f} B per step, "
              f"under the gradients' {floor:,.0f} B floor", flush=True)
    if valid:
        print(f"wire_bytes_ratio={pair_ratio(valid):.4f}")
    else:
        print("wire_bytes_ratio: no round with plausible samples; rerun with more --rounds")


if __name__ == "__main__":
    main()

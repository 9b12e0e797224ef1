"""Host-side work per training step: ``model.fit`` under hybridpar against a raw custom loop.

Counts, with ``cProfile`` over the timed steps, what the Python side does
per step: eager op dispatches (``TFE_Py_FastPathExecute``, one per op run
outside a traced function), traced-function executions (``TFE_Py_Execute``)
and Python function calls, and lists the functions where that host time
goes. Counts are exact and do not depend on the machine's load; they show
per-step overhead that step times on a busy machine cannot. Both variants
run in this process in turn, on the same model and data as
``benchmarks/multiworker.py --part steps`` (an MLP 64-512-512-10, SGD, global
batch 128), under the multi-worker strategy of one local worker:

- ``hybridpar``: ``model.fit`` under ``hybridpar.scope`` (``mode: multi_worker``);
- ``raw``: ``tf.distribute.MultiWorkerMirroredStrategy`` and the standard
  ``tf.function`` loop (``strategy.run``, ``compute_average_loss``,
  ``apply_gradients``, ``strategy.reduce``).

The last line is ``calls_ratio=<hybridpar Python calls per step / raw>``.

    python benchmarks/step_profile.py [--steps 200] [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from collections.abc import Sequence
from typing import Any

from raw_loop import custom_train_step  # beside this script

BATCH = 128
EAGER_OP = "TFE_Py_FastPathExecute"
GRAPH_CALL = "TFE_Py_Execute"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="Profiled steps per variant.")
    parser.add_argument("--top", type=int, default=12, help="Functions listed per variant.")
    args = parser.parse_args(argv)
    for name in ("steps", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Received: {getattr(args, name)}.")
    return args


def per_step_counts(stats: pstats.Stats, steps: int) -> dict[str, float]:
    """Python calls, eager op dispatches and traced-function runs per step."""
    counts = {"python_calls": stats.total_calls / steps, "eager_ops": 0.0, "graph_runs": 0.0}
    for (_, _, name), (_, calls, *_rest) in stats.stats.items():
        if EAGER_OP in name:
            counts["eager_ops"] += calls / steps
        elif GRAPH_CALL in name:
            counts["graph_runs"] += calls / steps
    return counts


def _model_and_data() -> tuple[Any, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 64), dtype=np.float32)
    y = rng.integers(0, 10, size=(4096,), dtype=np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    return model, data


def profile_fit(steps: int) -> pstats.Stats:
    """``model.fit`` under hybridpar: a warm-up epoch, then ``steps`` profiled steps."""
    import keras

    import hybridpar

    profiler = cProfile.Profile()
    config = {"data_parallel": {"mode": "multi_worker"},
              "data": {"global_batch_size": BATCH, "shard_policy": "data"}}
    with hybridpar.scope(config):
        model, data = _model_and_data()
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Profiled(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self._timed:
                profiler.enable()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            profiler.disable()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._timed = epoch == 1

    model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[Profiled()])
    return pstats.Stats(profiler)


def profile_raw(steps: int) -> pstats.Stats:
    """The raw custom loop: a warm-up pass, then ``steps`` profiled steps."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, data = _model_and_data()
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    train_step = custom_train_step(strategy, model, optimizer, BATCH)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    for _ in range(steps):
        train_step(iterator)
    profiler = cProfile.Profile()
    losses = []
    for _ in range(steps):
        profiler.enable()
        losses.append(train_step(iterator))
        profiler.disable()
    return pstats.Stats(profiler)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}: MLP 64-512-512-10, SGD, "
          f"batch {BATCH}, MultiWorkerMirroredStrategy of one local worker; {args.steps} "
          "profiled steps per variant (cProfile)")
    counts = {}
    for variant, profile in (("hybridpar", profile_fit), ("raw", profile_raw)):
        stats = profile(args.steps)
        counts[variant] = per_step_counts(stats, args.steps)
        c = counts[variant]
        print(f"{variant}: per step {c['python_calls']:.0f} Python calls, "
              f"{c['eager_ops']:.2f} eager op dispatches, {c['graph_runs']:.2f} traced-function "
              "runs; host time by function (tottime over all profiled steps):")
        text = io.StringIO()
        stats.stream = text
        stats.sort_stats("tottime").print_stats(args.top)
        print("\n".join("    " + line for line in text.getvalue().splitlines()
                        if line.strip() and "function calls" not in line), flush=True)
    ratio = counts["hybridpar"]["python_calls"] / counts["raw"]["python_calls"]
    print(f"calls_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()

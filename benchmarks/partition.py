"""How close ``placement: auto`` and ``auto: profile`` come to the best contiguous cut.

For a 12-block transformer (``hybridpar_models`` digits_transformer, 8 tokens)
and keras.applications ResNet50V2 (32x32, weights=None), every placeable layer
(``hybridpar.parallel.layer_costs.model_units``) is timed once, forward and
backward on one CPU device (the reference, ``--repeats`` timed calls, the
fastest kept). Against those times:

* the optimum: the smallest slowest stage over every contiguous cut into S
  stages (exhaustive search, independent of hybridpar's dynamic program);
* ``auto``: the cut of the static cost (FLOPs and bytes, no run);
* ``auto: profile``: the cut of a second, separate profile, as a training
  run makes it (so profile noise counts against it).

Each cut's slowest stage is read off the reference times and divided by the
optimum's, for S = 2 and 4 (targets: profile <= 1.05, auto <= 1.25).

    python benchmarks/partition.py [--batch 32] [--repeats 5]

The last line is ``partition_ratio=<the worse model's auto: profile ratio at 4 stages>``.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence

STAGES = (2, 4)
MODELS = ("transformer12", "resnet50v2")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="Examples per profiled call.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed calls per layer.")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        parser.error("--batch and --repeats must be >= 1")
    return args


def bottleneck(times: Sequence[float], stage_of: Sequence[int]) -> float:
    """The slowest stage of a cut, by ``times``."""
    totals: dict[int, float] = {}
    for time, stage in zip(times, stage_of, strict=True):
        totals[stage] = totals.get(stage, 0.0) + time
    return max(totals.values())


def exhaustive_bottleneck(times: Sequence[float], stages: int) -> float:
    """The smallest slowest stage over every contiguous cut into non-empty ``stages``."""
    prefix = [0.0]
    for time in times:
        prefix.append(prefix[-1] + time)
    count = len(times)
    best = float("inf")
    for cuts in itertools.combinations(range(1, count), stages - 1):
        bounds = (0, *cuts, count)
        slowest = max(prefix[bounds[k + 1]] - prefix[bounds[k]] for k in range(stages))
        best = min(best, slowest)
    return best


def build(name: str):
    """The model ``name`` of ``MODELS``, built, seeded."""
    import hybridpar_models
    import keras

    keras.utils.set_random_seed(0)
    if name == "transformer12":
        return hybridpar_models.get("digits_transformer")(blocks=12, dim=64)
    return keras.applications.ResNet50V2(weights=None, input_shape=(32, 32, 3), classes=10)


def cut(costs: Sequence[float], stages: int) -> tuple[int, ...]:
    """hybridpar's cut of ``costs`` (no pins, no memory limit)."""
    from hybridpar.topology.partition import Unit, partition

    return partition([Unit(str(i), c) for i, c in enumerate(costs)], stages).stage_of


def measure_model(name: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """Per stage count: the optimum and the ratios of auto and auto: profile."""
    from hybridpar.parallel import layer_costs, layer_profile

    model = build(name)
    units = layer_costs.model_units(model)
    reference = layer_profile.measure(units, args.batch, args.repeats)
    profile = layer_profile.measure(units, args.batch, 3)
    static = [layer_costs.static_cost(unit).cost for unit in units]
    print(f"{name}: {len(units)} layers, reference {sum(reference) * 1e3:.2f} ms "
          f"forward+backward at batch {args.batch}", flush=True)
    results = {}
    for stages in STAGES:
        best = exhaustive_bottleneck(reference, stages)
        dp = bottleneck(reference, cut(reference, stages))
        ratios = {
            "optimum_ms": best * 1e3,
            "dp_over_exhaustive": dp / best,
            "auto": bottleneck(reference, cut(static, stages)) / best,
            "profile": bottleneck(reference, cut(profile, stages)) / best,
        }
        print(f"  {stages} stages: optimum slowest stage {best * 1e3:.3f} ms (of "
              f"{sum(reference) / stages * 1e3:.3f} ms mean), auto {ratios['auto']:.3f}x, "
              f"auto: profile {ratios['profile']:.3f}x, hybridpar's DP on the reference "
              f"{ratios['dp_over_exhaustive']:.3f}x", flush=True)
        results[stages] = ratios
    return results


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; one CPU device, "
          f"batch {args.batch}, {args.repeats} timed calls per layer", flush=True)
    results = {name: measure_model(name, args) for name in MODELS}
    worst_auto = max(results[name][4]["auto"] for name in MODELS)
    print(f"auto_ratio={worst_auto:.3f}", flush=True)
    print(f"partition_ratio={max(results[name][4]['profile'] for name in MODELS):.3f}",
          flush=True)


if __name__ == "__main__":
    main()

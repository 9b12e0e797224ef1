"""The contiguous cost-balancing cut (pure Python, no TensorFlow)."""

import itertools
import random

import pytest

from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError
from hybridpar.topology.partition import Unit, imbalance, partition


def units(*costs: float, pins: dict[int, int] | None = None, sizes=None) -> list[Unit]:
    pins = pins or {}
    sizes = sizes or [0] * len(costs)
    return [Unit(f"l{i}", c, sizes[i], pins.get(i)) for i, c in enumerate(costs)]


def brute_force(layers: list[Unit], stages: int, memory_limit=None) -> float:
    """The smallest slowest stage over every contiguous cut that honours pins and memory."""
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(layers)), stages - 1):
        bounds = [0, *cuts, len(layers)]
        runs = [layers[bounds[k]:bounds[k + 1]] for k in range(stages)]
        if any(u.pinned not in (None, k) for k, run in enumerate(runs) for u in run):
            continue
        if memory_limit is not None and any(
                sum(u.param_bytes for u in run) > memory_limit for run in runs):
            continue
        best = min(best, max(sum(u.cost for u in run) for run in runs))
    return best


def test_balances_contiguous_runs():
    cut = partition(units(1, 1, 1, 1, 4), 2)
    assert cut.stage_of == (0, 0, 0, 0, 1)
    assert cut.stage_costs == (4, 4)
    assert cut.imbalance == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(20))
def test_matches_the_exhaustive_optimum(seed):
    rng = random.Random(seed)
    count, stages = rng.randint(4, 11), rng.randint(2, 4)
    layers = [Unit(f"l{i}", rng.uniform(0.1, 10), rng.randint(1, 5),
                   None) for i in range(count)]
    pin_at = rng.randrange(count)
    layers[pin_at] = Unit(layers[pin_at].name, layers[pin_at].cost, layers[pin_at].param_bytes,
                          min(stages - 1, max(0, pin_at * stages // count)))
    limit = rng.choice([None, 12, 20])
    expected = brute_force(layers, stages, limit)
    if expected == float("inf"):
        with pytest.raises(ConfigError):
            partition(layers, stages, limit)
        return
    cut = partition(layers, stages, limit)
    assert cut.bottleneck == pytest.approx(expected)
    assert list(cut.stage_of) == sorted(cut.stage_of)
    assert set(cut.stage_of) == set(range(stages))
    assert layers[pin_at].pinned == cut.stage_of[pin_at]


def test_pins_constrain_the_cut():
    cut = partition(units(5, 1, 1, 1, pins={1: 1}), 2)
    assert cut.stage_of == (0, 1, 1, 1)


def test_imbalance_is_slowest_over_mean():
    assert imbalance([3, 1]) == pytest.approx(1.5)
    assert imbalance([0, 0]) == 1.0


def test_more_stages_than_layers_names_layers_and_numbers():
    with pytest.raises(ConfigError, match=r"cannot cut 2 layer\(s\) \(l0, l1\) into "
                                          r"model_parallel.stages=3.*at most 2"):
        partition(units(1, 1), 3)


def test_pins_out_of_topological_order_name_both_layers():
    with pytest.raises(ConfigError, match=r"layer 'l1' \(position 1.*stage 1, but the later "
                                          r"layer 'l3' \(position 3\) is pinned to stage 0"):
        partition(units(1, 1, 1, 1, pins={1: 1, 3: 0}), 2)


def test_a_pin_that_leaves_a_stage_empty_is_refused():
    with pytest.raises(ConfigError, match=r"No contiguous cut of 3 layer\(s\) into 3.*'l0' "
                                          r"\(position 0\) -> stage 2"):
        partition(units(1, 1, 1, pins={0: 2}), 3)


def test_a_layer_above_the_memory_limit_names_its_bytes():
    with pytest.raises(ConfigError, match=r"'l1' \(2,000 bytes\).*device_memory_bytes=1,000"):
        partition(units(1, 1, 1, sizes=[10, 2000, 10]), 2, memory_limit=1000)


def test_the_memory_limit_shapes_the_cut():
    cut = partition(units(1, 1, 10, sizes=[600, 600, 10]), 2, memory_limit=1000)
    assert cut.stage_of == (0, 1, 1)
    with pytest.raises(ConfigError, match="device_memory_bytes=1,000 parameter bytes per stage"):
        partition(units(1, 1, 1, sizes=[600, 600, 600]), 2, memory_limit=1000)


def test_config_placement_auto_forms():
    def section(**values):
        return StrategyConfig.from_dict({"model_parallel": values}).model_parallel

    assert section(stages=2).auto == "static"
    assert section(stages=1).auto is None
    assert section(stages=2, placement="auto").auto == "static"
    profile = section(stages=2, placement={"auto": "profile", "^head": 1})
    assert (profile.auto, profile.rules) == ("profile", {"^head": 1})
    manual = section(stages=2, placement={"^head": 1})
    assert (manual.auto, manual.rules) == (None, {"^head": 1})
    assert section(stages=2, device_memory_bytes=10**9).device_memory_bytes == 10**9


@pytest.mark.parametrize("placement, message", [
    ("atuo", r"'auto' or a mapping.*Received: model_parallel.placement='atuo'. Did you mean "
             r"\"auto\""),
    ({"auto": "profil"}, r"placement.auto must be one of 'static', 'profile'.*Did you mean "
                         r"\"profile\""),
    ({"^a": "x"}, r"placement\['\^a'\] must be a stage index"),
])
def test_config_refuses_bad_placement(placement, message):
    with pytest.raises(ConfigError, match=message):
        StrategyConfig.from_dict({"model_parallel": {"stages": 2, "placement": placement}})


def test_a_stage_count_that_does_not_divide_the_devices_is_refused():
    from hybridpar.errors import RuntimeMismatchError
    from hybridpar.topology.plan import make_plan

    config = StrategyConfig.from_dict({"data_parallel": {"mode": "mirrored"},
                                       "model_parallel": {"stages": 3}})
    cpus = [f"/device:CPU:{i}" for i in range(4)]
    with pytest.raises(RuntimeMismatchError, match=r"stages=3 does not divide the 4 local "
                                                   r"devices.*1 of them would sit idle"):
        make_plan(config, cpus, None)

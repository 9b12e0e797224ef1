"""``model_parallel.placement: auto``: cut a built model into balanced stages and move its weights.

Variables are created when a layer is built, before the whole model exists,
so every layer no rule or ``hybridpar.stage()`` pins is first built on stage
0. Once the model is complete (``hs.describe(model)`` or the first
``fit``/``evaluate``/``predict``, before the optimizer is built), the units
of ``layer_costs`` are cut by ``hybridpar.topology.partition`` into
contiguous stages that balance a static or a profiled cost, the cut is
recorded in the placement rules (so each call runs on its stage), and the
variables of every unit cut onto a stage other than 0 are made again on
that stage's devices with their current values.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tensorflow as tf

from hybridpar.errors import ConfigError
from hybridpar.parallel import layer_costs, layer_profile
from hybridpar.parallel.staging import StagePlacer, require_built
from hybridpar.topology import partition as partition_lib

logger = logging.getLogger("hybridpar")


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """The cut of one model, for the report.

    Attributes:
        costs: ``static`` or ``profile``.
        units: the placeable layers in topological order.
        stage_of: each unit's stage.
        pinned: for each unit, whether a rule or ``stage()`` pinned it.
        unit_costs: each unit's cost (FLOP-equivalents, or seconds per step).
        flops: each unit's estimated forward FLOPs per example.
        param_bytes: each unit's parameter bytes.
        stages: the number of stages.
    """

    costs: str
    units: tuple[layer_costs.ModelUnit, ...]
    stage_of: tuple[int, ...]
    pinned: tuple[bool, ...]
    unit_costs: tuple[float, ...]
    flops: tuple[float, ...]
    param_bytes: tuple[int, ...]
    stages: int

    def stage_total(self, values: tuple[float, ...] | tuple[int, ...], stage: int) -> float:
        """The sum of ``values`` over the units of ``stage``."""
        return sum(v for v, s in zip(values, self.stage_of, strict=True) if s == stage)

    @property
    def imbalance(self) -> float:
        """Slowest stage over the mean stage, by the cost the cut balanced."""
        return partition_lib.imbalance(
            [self.stage_total(self.unit_costs, k) for k in range(self.stages)]
        )


def pinned_stage(placer: StagePlacer, unit: layer_costs.ModelUnit) -> int | None:
    """The stage a rule or ``stage()`` mark gives ``unit`` (or an enclosing layer), if any."""
    layer = unit.layer
    mark = getattr(layer, "_hybridpar_stage", None)
    prefix = [(name, None) for name in unit.path[:-1]]
    return placer.rules.resolve([*prefix, (layer.name, mark)])


def plan_stages(model: Any, placer: StagePlacer, costs: str, batch: int,
                memory_limit: int | None) -> StagePlan:
    """The cut of ``model`` (not applied).

    Raises:
        ConfigError: as ``hybridpar.topology.partition.partition`` does.
    """
    units = layer_costs.model_units(model)
    pins = [pinned_stage(placer, unit) for unit in units]
    static = [layer_costs.static_cost(unit) for unit in units]
    if costs == "profile":
        unit_costs = layer_profile.measure(units, batch)
    else:
        unit_costs = [c.cost for c in static]
    cut = partition_lib.partition(
        [partition_lib.Unit(u.name, cost, c.param_bytes, pin)
         for u, cost, c, pin in zip(units, unit_costs, static, pins, strict=True)],
        placer.mesh.stages, memory_limit,
    )
    return StagePlan(
        costs=costs, units=tuple(units), stage_of=cut.stage_of,
        pinned=tuple(pin is not None for pin in pins), unit_costs=tuple(unit_costs),
        flops=tuple(c.flops for c in static), param_bytes=tuple(c.param_bytes for c in static),
        stages=placer.mesh.stages,
    )


def _replace(variable: Any, target: Any) -> None:
    """Makes ``variable``'s ``tf.Variable`` again on ``target``'s devices, same value."""
    old = variable.value
    value = tf.identity(old.read_value() if hasattr(old, "read_value") else old)

    def creator(next_creator: Any, **kwargs: Any) -> Any:
        return next_creator(**{**kwargs, "colocate_with": target})

    with tf.init_scope(), tf.variable_creator_scope(creator):
        variable._value = tf.Variable(
            value, trainable=old.trainable, name=variable.name,
            aggregation=old.aggregation, synchronization=old.synchronization,
        )


def apply(plan: StagePlan, model: Any, placer: StagePlacer) -> None:
    """Records ``plan`` in the placement rules and moves the weights it cuts off stage 0.

    Raises:
        ConfigError: if the optimizer was built already (its slots would stay
            on stage 0).
    """
    moving = [(u, s) for u, s, pin in zip(plan.units, plan.stage_of, plan.pinned, strict=True)
              if s and not pin]
    optimizer = getattr(model, "optimizer", None)
    if moving and optimizer is not None and getattr(optimizer, "built", False):
        raise ConfigError(
            f"model_parallel.placement 'auto' must cut model {model.name!r} before its "
            "optimizer is built (its slots would stay on stage 0), but the optimizer was "
            "built already. Call hs.describe(model) right after building the model, before "
            "loading an optimizer state or building the optimizer."
        )
    placer.rules.assign({
        path: stage
        for unit, stage, pin in zip(plan.units, plan.stage_of, plan.pinned, strict=True) if not pin
        for path, _ in unit.uses
    })
    moved: set[int] = set()
    with model.distribute_strategy.scope():
        for unit, stage in moving:
            target = placer.colocation(stage)
            for variable in unit.layer.weights:
                if id(variable) not in moved:
                    moved.add(id(variable))
                    _replace(variable, target)
    placer.partition = plan


def ensure_placed(model: Any, placer: StagePlacer, batch: int = 16) -> StagePlan | None:
    """Cuts ``model`` once by ``placer.auto`` (later calls return the same plan).

    ``batch``: the examples per microbatch a profile runs; ``None`` is
    returned when the placer has no automatic cut.

    Raises:
        ConfigError: for a model that is not built, or as ``plan_stages`` and
            ``apply`` do.
    """
    if placer.auto is None or placer.mesh.stages == 1:
        return None
    done = getattr(model, "_hybridpar_stage_plan", None)
    if done is not None:
        return done
    require_built(model, "model_parallel.placement 'auto'")
    plan = plan_stages(model, placer, placer.auto, batch, placer.memory_limit)
    apply(plan, model, placer)
    object.__setattr__(model, "_hybridpar_stage_plan", plan)
    logger.info("placement auto (%s): imbalance %.3f", placer.auto, plan.imbalance)
    return plan

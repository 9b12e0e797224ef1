"""Placement report: which layer runs where, and the bytes each device holds."""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from typing import Any

import keras
import tensorflow as tf

from hybridpar.config.devices import canonical_device
from hybridpar.parallel import auto_placement, layer_costs
from hybridpar.parallel.staging import StagePlacer, model_layer_paths
from hybridpar.topology.mesh import DeviceMesh
from hybridpar.topology.partition import imbalance as partition_imbalance


@dataclasses.dataclass(frozen=True)
class LayerPlacement:
    """One layer's row of the report.

    Attributes:
        path: the layer's name, prefixed by its enclosing layers.
        stage: the stage it runs on.
        placed_by: ``stage()``, ``rule '<regex>'``, ``inside '<layer>'`` or
            ``default`` (nothing placed it: stage 0).
        devices: the devices holding its variables (its stage's devices when
            it has none).
        params: number of parameters it owns (not counting sublayers).
    """

    path: str
    stage: int
    placed_by: str
    devices: tuple[str, ...]
    params: int


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """Layers, stages and devices of a model under a hybridpar strategy.

    Attributes:
        mesh: the replicas x stages mesh.
        layers: one row per layer, in model order.
        weight_bytes: bytes of model variables per device.
        optimizer_bytes: bytes of optimizer variables (slots) per device.
        unplaced: layers nothing placed (they run on stage 0).
        stages: per stage: its layers, parameter bytes, estimated FLOPs or
            measured time, and the imbalance (``None`` with one stage).
    """

    mesh: DeviceMesh
    layers: tuple[LayerPlacement, ...]
    weight_bytes: dict[str, int]
    optimizer_bytes: dict[str, int]
    unplaced: tuple[str, ...]
    stages: StageSummary | None = None

    def device_bytes(self, device: str) -> int:
        """Weights plus optimizer state held by ``device``."""
        return self.weight_bytes.get(device, 0) + self.optimizer_bytes.get(device, 0)

    def __str__(self) -> str:
        mesh = self.mesh
        lines = [f"hybridpar placement: {mesh.replicas} replica(s) x {mesh.stages} stage(s)"]
        width = max([len(row.path) for row in self.layers] + [5])
        lines.append(f"  {'layer':<{width}}  stage  {'params':>9}  placed by / devices")
        for row in self.layers:
            lines.append(
                f"  {row.path:<{width}}  {row.stage:>5}  {row.params:>9,}  "
                f"{row.placed_by}: {', '.join(row.devices)}"
            )
        lines.append("  device (replica, stage): weights + optimizer state")
        for replica in range(mesh.replicas):
            for stage in range(mesh.stages):
                device = mesh.device(replica, stage)
                weights = _megabytes(self.weight_bytes.get(device, 0))
                slots = _megabytes(self.optimizer_bytes.get(device, 0))
                lines.append(f"  {device} ({replica}, {stage}): {weights} + {slots}")
        for device in sorted(set(self.weight_bytes) | set(self.optimizer_bytes)):
            if device not in mesh.devices:
                weights = _megabytes(self.weight_bytes.get(device, 0))
                slots = _megabytes(self.optimizer_bytes.get(device, 0))
                lines.append(f"  {device}: {weights} + {slots}")
        if self.unplaced:
            lines.append(
                f"  not placed by any rule (on stage 0): {', '.join(self.unplaced)}"
            )
        if self.stages is not None:
            lines.extend(self.stages.lines())
        return "\n".join(lines)

    def save_png(self, path: str | os.PathLike) -> None:
        """Draws the mesh (replicas as rows, stages as columns) with each
        stage's layers and bytes, as a PNG file."""
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot

        mesh = self.mesh
        by_stage: dict[int, list[str]] = defaultdict(list)
        for row in self.layers:
            if "/" not in row.path:
                by_stage[row.stage].append(row.path)
        figure, axes = pyplot.subplots(
            figsize=(3.2 * mesh.stages + 0.6, 2.6 * mesh.replicas + 0.6), dpi=100
        )
        colours = pyplot.get_cmap("tab10")
        for replica in range(mesh.replicas):
            for stage in range(mesh.stages):
                device = mesh.device(replica, stage)
                y = mesh.replicas - 1 - replica
                axes.add_patch(
                    matplotlib.patches.FancyBboxPatch(
                        (stage + 0.05, y + 0.05), 0.9, 0.9, boxstyle="round,pad=0.01",
                        facecolor=colours(stage % 10), alpha=0.25, edgecolor="black",
                    )
                )
                names = by_stage.get(stage, [])
                shown = names[:8] + ([f"... +{len(names) - 8}"] if len(names) > 8 else [])
                cost = [self.stages.rows[stage].figure()] if self.stages is not None else []
                text = "\n".join(
                    [f"{device}", f"replica {replica}, stage {stage}",
                     _megabytes(self.device_bytes(device)), *cost, "", *shown]
                )
                axes.text(stage + 0.1, y + 0.9, text, va="top", ha="left", fontsize=7,
                          family="monospace")
        axes.set_xlim(0, mesh.stages)
        axes.set_ylim(0, mesh.replicas)
        axes.set_axis_off()
        title = f"{mesh.replicas} replica(s) x {mesh.stages} stage(s)"
        if self.stages is not None:
            title += f", imbalance {self.stages.imbalance:.2f} ({self.stages.placed})"
        axes.set_title(title, fontsize=9)
        figure.tight_layout()
        figure.savefig(path)
        pyplot.close(figure)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3f} MB"


def _variable_parts(variable: Any) -> list[Any]:
    """The per-device tf.Variables behind a Keras, mirrored or sharded variable."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    for parts in ("values", "variables"):  # mirrored copies; parameter-server shards
        found = getattr(value, parts, None)
        if found:
            return [p for part in found for p in _variable_parts(part)]
    return [value]


def _bytes_per_device(variables: list[Any]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for variable in variables:
        for part in _variable_parts(variable):
            size = math.prod(part.shape) * tf.as_dtype(part.dtype).size
            totals[_local(part.device)] += size
    return dict(totals)


def _local(device: str) -> str:
    """``/device:TYPE:i``, prefixed by ``/job:ps/task:t`` for a parameter server's."""
    spec = tf.DeviceSpec.from_string(device)
    local = canonical_device(f"/device:{spec.device_type}:{spec.device_index or 0}")
    return f"/job:ps/task:{spec.task or 0}{local}" if spec.job == "ps" else local


def _placed_by(placer: StagePlacer, path: tuple[Any, ...]) -> tuple[int, str]:
    for depth, entry in enumerate(path):
        name, explicit = entry
        if explicit is not None:
            how = "stage()"
        elif placer.rules.rule_for(name) is not None:
            how = f"rule {placer.rules.rule_for(name)!r}"
        elif placer.rules.assigned_stage(path[: depth + 1]) is not None:
            stage = placer.rules.assigned_stage(path[: depth + 1])
            return stage, "auto" if depth == len(path) - 1 else f"inside {name!r}"
        else:
            continue
        stage = placer.rules.own_stage(entry)
        return stage, how if depth == len(path) - 1 else f"inside {name!r}"
    return 0, "default"


def describe(model: keras.Model, placer: StagePlacer, batch: int = 16) -> PlacementReport:
    """The placement report of ``model`` (built) under ``placer``.

    Under ``placement: auto`` the model is cut first, once
    (``hybridpar.parallel.auto_placement``; ``batch``: examples a profile runs).

    Raises:
        ConfigError: for a placement rule that matches no layer of the model,
            a layer matched by two rules, or a stage index out of range; and
            for the automatic cut's bad input.
    """
    auto_placement.ensure_placed(model, placer, batch)
    layer_paths = [
        (layer, path)
        for layer, path in model_layer_paths(model)
        if not isinstance(layer, keras.layers.InputLayer)
    ]
    unplaced = placer.rules.check_layers(path for _, path in layer_paths)
    rows = []
    for layer, path in layer_paths:
        stage, how = _placed_by(placer, path)
        inner = {id(w) for child in layer._layers for w in child.weights}
        own = [w for w in layer.weights if id(w) not in inner]
        devices = tuple(
            dict.fromkeys(_local(p.device) for w in own for p in _variable_parts(w))
        ) or placer.mesh.stage_devices(stage)
        rows.append(
            LayerPlacement(
                path="/".join(name for name, _ in path),
                stage=stage,
                placed_by=how,
                devices=devices,
                params=sum(math.prod(w.shape) for w in own),
            )
        )
    optimizer = getattr(model, "optimizer", None)
    optimizer_variables = list(optimizer.variables) if optimizer is not None else []
    return PlacementReport(
        mesh=placer.mesh,
        layers=tuple(rows),
        weight_bytes=_bytes_per_device(list(model.weights)),
        optimizer_bytes=_bytes_per_device(optimizer_variables),
        unplaced=tuple(
            "/".join(name for name, _ in path) for path in unplaced if len(path) == 1
        ),
        stages=stage_summary(model, placer) if placer.mesh.stages > 1 else None,
    )


@dataclasses.dataclass(frozen=True)
class StageRow:
    """One stage of the summary.

    Attributes:
        stage: its index.
        layers: its placeable layers, in topological order.
        param_bytes: bytes of their parameters.
        flops: their estimated forward FLOPs per example.
        seconds: their measured forward+backward seconds (``auto: profile``).
    """

    stage: int
    layers: tuple[str, ...]
    param_bytes: int
    flops: float
    seconds: float | None = None

    def figure(self) -> str:
        """Its cost: the measured time, or the estimated FLOPs."""
        if self.seconds is not None:
            return f"{self.seconds * 1e3:.3f} ms measured"
        return f"{self.flops / 1e6:.3f} MFLOP/example"


@dataclasses.dataclass(frozen=True)
class StageSummary:
    """Per stage: layers, parameter bytes, FLOPs or time; the imbalance; shared layers.

    Attributes:
        placed: how the layers were placed (``auto (static)``,
            ``auto (profile)`` or ``rules``).
        rows: one per stage.
        imbalance: the slowest stage over the mean, by the cost the cut
            balanced (static estimate for manual placement).
        shared: for each layer used more than once, where each use runs.
    """

    placed: str
    rows: tuple[StageRow, ...]
    imbalance: float
    shared: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The summary as report lines."""
        lines = [f"  stages ({self.placed}): imbalance {self.imbalance:.3f} (slowest / mean)"]
        for row in self.rows:
            first, last = (row.layers[0], row.layers[-1]) if row.layers else ("-", "-")
            lines.append(
                f"  stage {row.stage}: {len(row.layers)} layer(s) {first} .. {last}, "
                f"{_megabytes(row.param_bytes)} params, {row.figure()}"
            )
        lines.extend(f"  shared: {text}" for text in self.shared)
        return lines


def _shared_uses(units: list, stage_of: list[int]) -> tuple[str, ...]:
    at_position = {p: s for unit, s in zip(units, stage_of, strict=True) for p in unit.positions}
    texts = []
    for unit, stage in zip(units, stage_of, strict=True):
        if len(unit.uses) < 2:
            continue
        uses = []
        for (path, _), position in zip(unit.uses, unit.positions, strict=True):
            before = at_position.get(position - 1)
            source = f", input from stage {before}" if before not in (None, stage) else ""
            uses.append(f"{'/'.join(path)} on stage {stage}{source}")
        texts.append(f"{unit.name} placed once on stage {stage}; uses: {'; '.join(uses)}")
    return tuple(texts)


def stage_summary(model: keras.Model, placer: StagePlacer) -> StageSummary:
    """The per-stage summary of ``model``: the automatic cut's, or the rules' placement."""
    plan = getattr(model, "_hybridpar_stage_plan", None)
    if plan is not None:
        units, stage_of = list(plan.units), list(plan.stage_of)
        flops, sizes, costs = plan.flops, plan.param_bytes, plan.unit_costs
        placed = f"auto ({plan.costs})"
    else:
        units = layer_costs.model_units(model)
        stage_of = [auto_placement.pinned_stage(placer, unit) or 0 for unit in units]
        static = [layer_costs.static_cost(unit) for unit in units]
        flops = tuple(c.flops for c in static)
        sizes = tuple(c.param_bytes for c in static)
        costs = tuple(c.cost for c in static)
        placed = "rules"
    stages = placer.mesh.stages

    def total(values: Any, stage: int) -> float:
        return sum(v for v, s in zip(values, stage_of, strict=True) if s == stage)

    profiled = plan is not None and plan.costs == "profile"
    rows = tuple(
        StageRow(
            stage=k,
            layers=tuple(u.name for u, s in zip(units, stage_of, strict=True) if s == k),
            param_bytes=int(total(sizes, k)), flops=total(flops, k),
            seconds=total(costs, k) if profiled else None,
        )
        for k in range(stages)
    )
    return StageSummary(
        placed=placed, rows=rows,
        imbalance=partition_imbalance([total(costs, k) for k in range(stages)]),
        shared=_shared_uses(units, stage_of),
    )

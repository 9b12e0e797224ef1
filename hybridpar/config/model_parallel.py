"""The ``model_parallel`` section: stages, placement (manual rules and ``auto``), microbatches,
the pipeline schedule, tensor-parallel groups and their layout."""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from hybridpar.config.engine import Section, did_you_mean, positive, require
from hybridpar.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelParallelConfig(Section):
    """Model-parallel stages inside each replica.

    Attributes:
        stages: devices per replica; replicas = devices / stages.
        placement: ``auto`` (cut the layers into balanced contiguous stages by
            a static cost), or regex (searched in the layer name) -> stage
            index, optionally with ``auto: static | profile`` so that the
            automatic cut places the layers no rule pins. Empty with
            ``stages > 1`` means ``auto``.
        microbatches: pipeline microbatches per replica batch.
        device_memory_bytes: parameter bytes one device may hold, checked
            per layer and per stage by the automatic cut (``None``: no limit).
        schedule: ``gpipe`` (every microbatch's forward as soon as its input
            is ready; each stage holds all M microbatches' activations) or
            ``1f1b`` (PipeDream-flush: the same step, but stage ``k`` starts
            the forward of microbatch ``m`` only after the backward of
            ``m - (stages - k)``, so it holds at most ``stages - k``).
            ``1f1b`` needs ``stages > 1`` and ``microbatches > 1``.
        tensor: devices per tensor-parallel group (Megatron-style): each
            stage of a replica runs on ``tensor`` devices, which split its
            attention heads, MLP columns and vocabulary; replicas = devices /
            (stages x tensor).
        tensor_layout: which axis of each weight the group splits: ``auto``
            (attention heads, Dense column/row pairs, token embeddings; see
            ``hybridpar.topology.tensor_layout``), or regex (searched in the
            variable path) -> axis, or null to keep a weight whole; the rules
            override the automatic layout unless the mapping has ``auto: false``.
    """

    PATH: ClassVar[str] = "model_parallel"
    stages: int = 1
    placement: dict[str, int | str] | str = dataclasses.field(default_factory=dict)
    microbatches: int = 1
    device_memory_bytes: int | None = None
    schedule: str = "gpipe"
    tensor: int = 1
    tensor_layout: dict[str, int | bool | None] | str = "auto"

    def validate(self) -> None:
        positive("model_parallel.stages", self.stages)
        positive("model_parallel.microbatches", self.microbatches)
        positive("model_parallel.device_memory_bytes", self.device_memory_bytes)
        _check_schedule(self.schedule, self.stages, self.microbatches)
        positive("model_parallel.tensor", self.tensor)
        _check_tensor_layout(self.tensor_layout)
        placement = self.placement
        if isinstance(placement, str):
            require(
                placement == "auto",
                "model_parallel.placement must be 'auto' or a mapping of regex -> stage. "
                f"Received: model_parallel.placement={placement!r}."
                f"{did_you_mean(placement, ['auto'])}",
            )
            placement = {"auto": "static"}
            object.__setattr__(self, "placement", placement)
        for pattern, stage in placement.items():
            if pattern == AUTO_KEY:
                require(
                    stage in AUTO_COSTS,
                    f"model_parallel.placement.auto must be one of "
                    f"{', '.join(map(repr, AUTO_COSTS))}. Received: {stage!r}."
                    f"{did_you_mean(str(stage), AUTO_COSTS)}",
                )
                continue
            _check_rule(pattern, stage, self.stages)

    @property
    def rules(self) -> dict[str, int]:
        """The manual rules: regex -> stage index (``auto`` left out)."""
        return {k: v for k, v in self.placement.items() if k != AUTO_KEY}

    @property
    def auto(self) -> str | None:
        """``static`` or ``profile`` when the automatic cut places layers, else ``None``."""
        if AUTO_KEY in self.placement:
            return self.placement[AUTO_KEY]
        return "static" if self.stages > 1 and not self.placement else None

    @property
    def tensor_rules(self) -> dict[str, int | None]:
        """The manual tensor-layout rules: regex -> axis, or ``None`` (kept whole)."""
        layout = self.tensor_layout
        return {} if isinstance(layout, str) else {
            k: v for k, v in layout.items() if k != AUTO_KEY}

    @property
    def tensor_auto(self) -> bool:
        """Whether the automatic layout splits the weights no manual rule names."""
        layout = self.tensor_layout
        return isinstance(layout, str) or layout.get(AUTO_KEY, True) is not False


AUTO_KEY = "auto"
AUTO_COSTS = ("static", "profile")
SCHEDULES = ("gpipe", "1f1b")


def _check_schedule(schedule: str, stages: int, microbatches: int) -> None:
    require(
        schedule in SCHEDULES,
        f"model_parallel.schedule must be one of {', '.join(map(repr, SCHEDULES))}. "
        f"Received: {schedule!r}.{did_you_mean(str(schedule), SCHEDULES)}",
    )
    require(
        schedule != "1f1b" or (stages > 1 and microbatches > 1),
        "model_parallel.schedule='1f1b' orders the microbatches of a pipeline, so it needs "
        f"model_parallel.stages > 1 and model_parallel.microbatches > 1. Received: "
        f"stages={stages}, microbatches={microbatches}. Raise them, or leave the schedule "
        "at 'gpipe' (with one stage the microbatches already run one after another).",
    )


def _check_tensor_layout(layout: dict[str, int | bool | None] | str) -> None:
    if isinstance(layout, str):
        require(
            layout == "auto",
            "model_parallel.tensor_layout must be 'auto' or a mapping of regex -> axis "
            f"(or null). Received: model_parallel.tensor_layout={layout!r}."
            f"{did_you_mean(layout, ['auto'])}",
        )
        return
    for pattern, axis in layout.items():
        if pattern == AUTO_KEY:
            require(
                isinstance(axis, bool),
                "model_parallel.tensor_layout.auto must be true or false (whether the "
                "automatic layout splits the weights no rule names). Received: "
                f"{axis!r}.",
            )
            continue
        require(
            axis is None or (isinstance(axis, int) and not isinstance(axis, bool)),
            f"model_parallel.tensor_layout[{pattern!r}] must be the axis to split (an "
            f"integer) or null to keep the weight whole. Received: {axis!r}.",
        )
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(
                f"model_parallel.tensor_layout key is not a valid regular expression "
                f"({err}). Received: {pattern!r}."
            ) from None


def _check_rule(pattern: str, stage: int | str, stages: int) -> None:
    require(
        isinstance(stage, int),
        f"model_parallel.placement[{pattern!r}] must be a stage index (an integer); only "
        f"the key 'auto' takes 'static' or 'profile'. Received: {stage!r}.",
    )
    try:
        re.compile(pattern)
    except re.error as err:
        raise ConfigError(
            f"model_parallel.placement key is not a valid regular expression "
            f"({err}). Received: {pattern!r}."
        ) from None
    require(
        0 <= stage < stages,
        f"model_parallel.placement[{pattern!r}] names stage {stage}, but "
        f"model_parallel.stages={stages} allows stages 0..{stages - 1}. "
        "Raise model_parallel.stages or fix the index.",
    )

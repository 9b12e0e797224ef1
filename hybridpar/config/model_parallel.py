"""The ``model_parallel`` section: stages, placement (manual rules and ``auto``), microbatches."""

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
    """

    PATH: ClassVar[str] = "model_parallel"
    stages: int = 1
    placement: dict[str, int | str] | str = dataclasses.field(default_factory=dict)
    microbatches: int = 1
    device_memory_bytes: int | None = None

    def validate(self) -> None:
        positive("model_parallel.stages", self.stages)
        positive("model_parallel.microbatches", self.microbatches)
        positive("model_parallel.device_memory_bytes", self.device_memory_bytes)
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


AUTO_KEY = "auto"
AUTO_COSTS = ("static", "profile")


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

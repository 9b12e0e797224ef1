"""``model_parallel.tensor: T``: split a built model's weights over each stage's group of T devices.

Variables are created when a layer is built, before the whole model exists,
and the automatic layout reads pairs of layers (a block's column and row
Dense), so every weight is first created whole on its stage's devices. Once
the model is complete (``hs.describe(model)`` or the first
``fit``/``evaluate``/``predict``, before the optimizer is built), the layout
(``hybridpar.topology.tensor_layout``) is resolved on the model's weights and
each weight it names is stored as shards (``split_variable.split_in_place``):
shard ``t`` on device ``t`` of its stage's group, in every replica. The
optimizer, built afterwards on the shards (``compat.shard_views``), keeps one
slot set per shard on the same devices. The split layers then compute on
their shards (``tensor_calls``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import tensorflow as tf

from hybridpar.errors import ConfigError
from hybridpar.parallel import tensor_calls, tensor_embedding
from hybridpar.parallel.split_variable import SplitVariable, split_in_place
from hybridpar.parallel.staging import require_built
from hybridpar.parallel.tensor_weights import weight_infos
from hybridpar.state import StrategyState
from hybridpar.topology.mesh import DeviceMesh
from hybridpar.topology.tensor_layout import Split, resolve_layout

logger = logging.getLogger("hybridpar")


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """The split of one model, for the report and the benchmark.

    Attributes:
        size: devices per tensor-parallel group.
        splits: each split weight's path -> its split.
        split_bytes: bytes of the split weights (whole).
        whole_bytes: bytes of the weights every device of a group holds whole.
    """

    size: int
    splits: dict[str, Split]
    split_bytes: int
    whole_bytes: int

    @property
    def device_bytes(self) -> float:
        """Parameter bytes one device of a group holds."""
        return self.split_bytes / self.size + self.whole_bytes

    @property
    def memory_ratio(self) -> float:
        """Parameter bytes per device over the unsplit model's."""
        return self.device_bytes / max(1, self.split_bytes + self.whole_bytes)


def _device_key(name: str) -> tuple[str, int]:
    spec = tf.DeviceSpec.from_string(name)
    return (spec.device_type or "CPU").upper(), spec.device_index or 0


def stage_of_variable(value: Any, mesh: DeviceMesh) -> int:
    """The stage whose leaders hold ``value`` (a ``tf.Variable``, mirrored or not)."""
    held = {_device_key(v.device) for v in getattr(value, "values", (value,))}
    for stage in range(mesh.stages):
        if _device_key(mesh.stage_devices(stage)[0]) in held:
            return stage
    return 0


def _check_splittable(model: Any, size: int) -> None:
    require_built(model, f"model_parallel.tensor={size}")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        raise ConfigError(
            f"model_parallel.tensor={size} must split model {model.name!r} before its "
            "optimizer is built (its slots would stay whole), but the optimizer was built "
            "already. Call hs.describe(model) right after building the model, before "
            "loading an optimizer state or building the optimizer."
        )


def plan_split(model: Any, state: StrategyState) -> TensorPlan:
    """The layout of ``model`` for ``state``'s groups (not applied).

    Raises:
        ConfigError: as ``resolve_layout`` does, or when it splits no weight.
    """
    parallel = state.config.model_parallel
    size = state.plan.mesh.tensor
    weights = weight_infos(model)
    splits = resolve_layout(size, weights, parallel.tensor_rules, parallel.tensor_auto)
    if not splits:
        raise ConfigError(
            f"model_parallel.tensor={size} found no weight of model {model.name!r} to split: "
            "the automatic layout splits attention heads, Dense column/row pairs and token "
            "embeddings, and this model has none. Name the weights to split in "
            "model_parallel.tensor_layout (regex on variable paths such as "
            f"{', '.join(repr(w.path) for w in weights[:3])} -> axis), or set "
            "model_parallel.tensor to 1."
        )
    dtypes = {variable.path: variable.dtype for variable in model.weights}
    nbytes = {w.path: math.prod(w.shape) * tf.as_dtype(dtypes[w.path]).size for w in weights}
    split_bytes = sum(nbytes[path] for path in splits)
    return TensorPlan(size=size, splits=splits, split_bytes=split_bytes,
                      whole_bytes=sum(nbytes.values()) - split_bytes)


def apply(plan: TensorPlan, model: Any, state: StrategyState) -> None:
    """Stores every weight ``plan`` splits as shards on its stage's group devices."""
    placer = state.placer
    mesh = state.plan.mesh
    with model.distribute_strategy.scope():
        for variable in model.weights:
            split = plan.splits.get(variable.path)
            if split is None or isinstance(variable._value, SplitVariable):
                continue
            stage = stage_of_variable(variable._value, mesh)
            split_in_place(variable, split.axis,
                           [placer.colocation(stage, shard) for shard in range(mesh.tensor)])


def ensure_split(model: Any, state: StrategyState) -> TensorPlan | None:
    """Splits ``model`` once for ``state``'s groups (later calls return the same plan).

    Returns:
        The plan, or ``None`` without tensor-parallel groups.

    Raises:
        ConfigError: for a model that is not built, an optimizer built
            already, or a layout as ``plan_split`` refuses it.
    """
    if state.plan.mesh.tensor == 1:
        return None
    done = getattr(model, "_hybridpar_tensor_plan", None)
    if done is not None:
        return done
    _check_splittable(model, state.plan.mesh.tensor)
    plan = plan_split(model, state)
    apply(plan, model, state)
    mesh = state.plan.mesh
    calls = tensor_calls.install(
        model, lambda layer: stage_of_variable(layer._kernel._value.variables[0], mesh),
        mesh.tensor)
    calls += tensor_embedding.install(model, lambda shard: stage_of_variable(shard, mesh))
    object.__setattr__(model, "_hybridpar_tensor_plan", plan)
    logger.info("tensor parallel: %d weights split over %d devices, %d layer calls split; "
                "parameter bytes per device %.3f of the model's", len(plan.splits), plan.size,
                calls, plan.memory_ratio)
    return plan

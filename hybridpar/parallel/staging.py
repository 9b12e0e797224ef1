"""Where each model-parallel stage's variables and compute go: the ``StagePlacer``.

With R replicas x S stages (``hybridpar.topology.mesh.DeviceMesh``) the
strategy's replicas run on the stage-0 devices. A stage-``k`` layer's
variables are created mirrored over the stage-``k`` devices of every replica
(one device under ``mode: none``; see ``hybridpar.strategies.staged_variables``),
so its gradients are all-reduced within that group and its optimizer slots,
which Keras colocates with the variable, follow. Its forward ops run under
``tf.device`` of stage ``k`` of the running replica, inside a
``hybridpar_stage<k>`` name scope, by which the gradient hook
(``hybridpar.compat.stage_gradients``) puts the backward ops on the same
device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import global_state
from tensorflow.python.distribute import numpy_dataset

from hybridpar.errors import ConfigError
from hybridpar.topology.mesh import DeviceMesh
from hybridpar.topology.placement import PathEntry, PlacementRules, path_entry

STAGE_SCOPE_RE = re.compile(r"hybridpar_stage(\d+)")
SHARD_SCOPE_RE = re.compile(r"hybridpar_stage(\d+)_shard(\d+)")


def stage_scope_name(stage: int) -> str:
    """The TF name scope that marks ops of ``stage`` (read back for gradients)."""
    return f"hybridpar_stage{stage}"


def shard_scope_name(stage: int, shard: int) -> str:
    """The TF name scope that marks ops of tensor-parallel ``shard`` of ``stage``."""
    return f"hybridpar_stage{stage}_shard{shard}"


class StagePlacer:
    """Stage placement for one strategy.

    Args:
        mesh: the local devices as replicas x stages.
        rules: the placement rules of the config.
        mirrored: True when the strategy mirrors variables (MirroredStrategy
            and MultiWorkerMirroredStrategy); False for OneDeviceStrategy.
        microbatches: pipeline microbatches per replica batch.
        auto: ``static`` or ``profile`` when the automatic cut places the
            layers no rule pins (``model_parallel.placement: auto``).
        memory_limit: parameter bytes one device may hold, or ``None``.
    """

    def __init__(
        self, mesh: DeviceMesh, rules: PlacementRules, mirrored: bool, microbatches: int = 1,
        auto: str | None = None, memory_limit: int | None = None,
    ) -> None:
        self.mesh = mesh
        self.rules = rules
        self.mirrored = mirrored
        self.microbatches = microbatches
        self.auto = auto
        self.memory_limit = memory_limit
        self.partition: Any = None  # the automatic cut, once decided (auto_placement)

    def stage_of(self, path: Sequence[PathEntry]) -> int:
        """The stage of the layer at the end of ``path`` (0 when nothing places it)."""
        stage = self.rules.resolve(path)
        return 0 if stage is None else stage

    def device_for(self, stage: int, shard: int = 0) -> str | None:
        """The device of ``shard`` of ``stage`` in the replica running now (``None``
        outside one; shard 0 is the stage's leader).

        Replicas are numbered worker-major across a cluster, so the local
        replica is the global id modulo this worker's replicas.
        """
        context = tf.distribute.get_replica_context()
        if context is None:
            return None
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica is None:
            return None
        return self.mesh.device(int(replica) % self.mesh.replicas, stage, shard)

    def colocation(self, stage: int, shard: int = 0) -> Any:
        """The ``colocate_with`` target that makes a variable of ``stage``'s devices
        (of its tensor-parallel ``shard``'s devices; shard 0: the leaders).

        MirroredStrategy mirrors a variable over the ``_devices`` of such an
        object; a ``numpy_dataset.SingleDevice`` makes a plain variable there.
        """
        devices = self.mesh.shard_devices(stage, shard)
        return OnDevices(devices) if self.mirrored else numpy_dataset.SingleDevice(devices[0])


class OnDevices:
    """A ``colocate_with`` target: MirroredStrategy mirrors a variable over its ``_devices``."""

    def __init__(self, devices: tuple[str, ...]) -> None:
        self._devices = devices


def layer_path(layer: Any = None) -> list[PathEntry]:
    """The layers whose Keras name scopes are open, outermost first, then ``layer``.

    The outermost model (the one being trained) is left out: its own name is
    not matched against placement rules. Reads Keras 3's name-scope stack
    (``keras.src.backend.common.global_state``), whose entries record the
    layer that opened them.
    """
    stack = global_state.get_global_attribute("name_scope_stack") or []
    layers = [entry.caller for entry in stack if isinstance(entry.caller, keras.Layer)]
    if layer is not None and (not layers or layers[-1] is not layer):
        layers.append(layer)
    if layers and isinstance(layers[0], keras.Model):
        layers = layers[1:]
    return [path_entry(each) for each in layers]


def model_layer_paths(model: keras.Model) -> list[tuple[Any, tuple[PathEntry, ...]]]:
    """Every layer inside ``model`` with its path of enclosing layers."""
    found: list[tuple[Any, tuple[PathEntry, ...]]] = []

    def visit(layer: Any, parents: tuple[PathEntry, ...]) -> None:
        path = (*parents, path_entry(layer))
        found.append((layer, path))
        for child in getattr(layer, "_layers", []):
            visit(child, path)

    for layer in getattr(model, "_layers", []):
        visit(layer, ())
    return found


def require_built(model: keras.Model, option: str) -> None:
    """Raises a ConfigError naming ``option`` when a layer of ``model`` is not built."""
    unbuilt = [layer.name for layer in model._flatten_layers() if not layer.built]
    if unbuilt:
        raise ConfigError(
            f"{option} reads the built model, but layer(s) {', '.join(unbuilt[:8])} of "
            f"{model.name!r} are not built. Build the model (keras.Input, or "
            "model.build(input_shape)) inside the scope before fit."
        )

"""Variables of a model-parallel stage are created on that stage's devices.

Upstream (TF 2.21, ``mirrored_strategy.MirroredExtended._create_variable``):
every variable created in a strategy's scope is mirrored over all replica
devices, and Keras ignores a ``tf.device`` block around construction (see
``stage_marks``), so nothing puts a layer's weights on another device. The
strategy honours a ``colocate_with`` argument, though: an object with
``_devices`` mirrors over exactly those devices, and a
``numpy_dataset.SingleDevice`` makes a plain variable there. hybridpar's
strategy classes override ``_create_variable`` to pass the stage's devices
for variables built inside a placed layer; slots, which Keras creates with a
``colocate_with`` of their variable, are left alone.
"""

from __future__ import annotations

from typing import Any

from hybridpar.parallel.staging import StagePlacer, layer_path


def placed(placer: StagePlacer, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of a variable being created, with its stage's devices as ``colocate_with``."""
    if kwargs.get("colocate_with") is not None:
        return kwargs
    stage = placer.stage_of(layer_path())
    if not stage:
        return kwargs
    return {**kwargs, "colocate_with": placer.colocation(stage)}

"""A placed layer runs on its stage's device in the running replica.

Upstream (Keras 3.15): under a strategy every op of a replica runs on the
replica's device; nothing puts a layer's forward ops elsewhere. Under a
hybridpar strategy with stages, the outermost placed layer of a call opens
``tf.device`` of its stage in the running replica, and a
``hybridpar_stage<k>`` name scope that ``stage_gradients`` reads; layers
inside it inherit both. Under ``model_parallel.schedule: 1f1b`` the call
also waits for the backward the schedule puts before it
(``hybridpar.parallel.one_f_one_b``). Layers nothing places run on the replica's own
device, which is stage 0. Installed only while a strategy with
``model_parallel.stages > 1`` is alive.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
import tensorflow as tf

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.parallel import one_f_one_b
from hybridpar.parallel.staging import layer_path, stage_scope_name
from hybridpar.state import state_of


class _StagedCall(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_staged_call = _StagedCall()


def _outermost_staged(*args: Any, **kwargs: Any) -> bool:
    if _staged_call.depth:
        return False
    state = state_of(tf.distribute.get_strategy())
    return state is not None and state.stages > 1


def _on_stage_device(original: Any) -> Any:
    def __call__(self, *args, **kwargs):
        state = state_of(tf.distribute.get_strategy())
        stage = state.placer.rules.resolve(layer_path(self))
        device = state.placer.device_for(stage) if stage is not None else None
        if device is None:  # nothing places the layer: the replica's device, stage 0
            return original(self, *args, **kwargs)
        _staged_call.depth += 1
        try:
            with (tf.device(device), tf.name_scope(stage_scope_name(stage)),
                  one_f_one_b.waiting(stage)):
                return original(self, *args, **kwargs)
        finally:
            _staged_call.depth -= 1

    return __call__


FIX = register(Fix(
    name="stage_calls",
    corrects="under a strategy every op of a replica runs on the replica's first device",
    group="stages",
    patches=(Patch(keras.Layer, "__call__", _on_stage_device, owns=_outermost_staged),),
))

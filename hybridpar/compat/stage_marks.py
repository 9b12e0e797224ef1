"""Layers constructed inside ``hybridpar.stage(k)`` remember their stage.

Upstream (Keras 3.15): a ``tf.device`` block around layer construction is
ignored, because variables are created later, when the layer is built. The
stage is therefore recorded on the layer object when it is constructed and
applied when it is built (``staged_variables``) and called (``stage_calls``).
``Layer.__new__`` is wrapped rather than ``__init__`` because Keras reads each
layer class's ``__init__`` signature to serialise it. Installed only while a
``hybridpar.stage()`` block is open.
"""

from __future__ import annotations

import functools
from typing import Any

import keras

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.topology import placement


def _recording(original: Any) -> Any:
    new = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(new)
    def __new__(cls, *args, **kwargs):
        layer = new(cls, *args, **kwargs)
        placement.record_layer(layer)
        return layer

    return staticmethod(__new__)


FIX = register(Fix(
    name="stage_marks",
    corrects="a tf.device block around layer construction is ignored (weights are built later)",
    group="stage_marks",
    patches=(Patch(keras.Layer, "__new__", _recording),),
))

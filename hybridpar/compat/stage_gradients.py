"""Backward ops of a placed layer run on its stage's device.

Upstream (TF 2.21, ``_gradient_function`` in
``tensorflow/python/eager/backprop.py``): the gradient of an op recorded by
a ``GradientTape`` is built under whatever device scope is active at
``tape.gradient`` time, not the forward op's device, so every backward op of
a model-parallel layer would run on the replica's first device. The tape
hands each gradient function the forward op's name scope; for ops recorded
inside a ``hybridpar_stage<k>`` scope (``stage_calls``) under a hybridpar
strategy, the gradient is built under ``tf.device`` of stage ``k`` in the
running replica; inside a ``hybridpar_stage<k>_shard<t>`` scope (the split
compute of ``hybridpar.parallel.tensor_calls``), on shard ``t``'s device of
it. The function is registered with TensorFlow's C++ tape when installed
and the original is registered again when removed. Installed only while a
strategy with ``model_parallel.stages > 1`` or ``tensor > 1`` is alive.

This fix owns the one patch of ``_gradient_function``, which also carries
``weight_gradient_split`` (the same group): for each op, first the split
(which may drop the weight input from the MatMul's gradient), then this
device placement, then TensorFlow's function. They used to be two patches,
the second wrapping the first's replacement as its "original" and each
registering its value with the C++ tape on revert: reverted out of the
reverse order of installing, the tape would have kept a hybridpar function
after both were gone. One patch restores and registers TensorFlow's own.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import backprop
from tensorflow.python.framework import ops

from hybridpar.compat import weight_gradient_split
from hybridpar.compat.patching import Fix, Patch, compose, register
from hybridpar.parallel.staging import SHARD_SCOPE_RE, STAGE_SCOPE_RE
from hybridpar.state import state_of


def _on_forward_device(original: Any) -> Any:
    @functools.wraps(original)
    def gradient_function(op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                          skip_input_indices, forward_pass_name_scope):
        arguments = (op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                     skip_input_indices, forward_pass_name_scope)
        scope = forward_pass_name_scope or ""
        marker = SHARD_SCOPE_RE.search(scope) or STAGE_SCOPE_RE.search(scope)
        state = state_of(tf.distribute.get_strategy()) if marker else None
        device = (state.placer.device_for(*(int(index) for index in marker.groups()))
                  if state is not None else None)
        if device is None:
            return original(*arguments)
        with ops.device(device):
            return original(*arguments)

    return gradient_function


FIX = register(Fix(
    name="stage_gradients",
    corrects="a GradientTape builds each gradient on the device active at tape.gradient, "
             "not the forward op's",
    group="stages",
    patches=(Patch(backprop, "_gradient_function",
                   compose(weight_gradient_split.deferring, _on_forward_device),
                   after=pywrap_tfe.TFE_Py_RegisterGradientFunction),),
))

"""A pipelined step computes each Dense weight gradient once per batch, not once per microbatch.

Upstream (TF 2.21, ``_MatMulGrad`` in ``tensorflow/python/ops/math_grad.py``,
called per op by ``_gradient_function`` in
``tensorflow/python/eager/backprop.py``): each ``tape.gradient`` builds a
MatMul's gradients against both inputs, so a step split into M microbatches
runs M full-size weight-gradient MatMuls of ``batch / M`` rows each, slower
than one of ``batch`` rows (30% more backward MatMul time at M = 4 on the
pipeline benchmark). Not a defect: Keras has no microbatches; hybridpar's
pipeline adds them.

While ``hybridpar.parallel.pipeline`` builds a microbatch's backward under
a hybridpar strategy, the gradient function of a MatMul whose right-hand
input is a weight read is built against the left-hand input only (TF's
own ``skip_input_indices`` path) and the weight gradient is handed to
``hybridpar.parallel.weight_gradients``, which computes it once for the
whole batch. Every other op, and every tape outside that step, gets the
original gradient function with the same arguments. Installed while a
strategy with ``model_parallel.stages > 1`` is alive, as the outer part of
``stage_gradients``' patch of ``_gradient_function`` (which registers it
with TensorFlow's C++ tape).
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from hybridpar.compat.patching import Fix, register
from hybridpar.parallel import weight_gradients
from hybridpar.state import state_of


def deferring(original: Any) -> Any:
    """Wraps a tape gradient function: MatMul weight gradients of a microbatch deferred."""

    @functools.wraps(original)
    def gradient_function(op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                          skip_input_indices, forward_pass_name_scope):
        recorder = weight_gradients.active()
        if (
            recorder is not None
            and not (skip_input_indices and 1 in skip_input_indices)
            and state_of(tf.distribute.get_strategy()) is not None
            and recorder.take(op_name, attr_tuple, inputs, out_grads)
        ):
            if 0 in (skip_input_indices or ()):  # the input needs no gradient either
                return [None] * num_inputs
            skip_input_indices = (*(skip_input_indices or ()), 1)
        return original(op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                        skip_input_indices, forward_pass_name_scope)

    return gradient_function


FIX = register(Fix(
    name="weight_gradient_split",
    corrects="a tape builds a full-size weight-gradient MatMul for every microbatch of a "
             "pipelined step",
    group="stages",
    part_of="stage_gradients",
))

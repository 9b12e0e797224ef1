"""Weight gradients of a pipelined step, computed once per batch instead of once per microbatch.

A microbatched step runs backward once per microbatch. For a layer
``y = x @ W`` each backward computes the activation gradient
``dx_i = dy_i @ W^T`` (the next stage down needs it, so stages keep
overlapping) and a full-size weight gradient ``dW_i = x_i^T @ dy_i``, which
is then summed over the microbatches. The M weight-gradient MatMuls do the
FLOPs of one, but each reduces over only ``batch / M`` rows into a full
``[in, out]`` output, which CPUs (and accelerators) run far less
efficiently, and the sum adds M - 1 full-size additions.

``DeferredWeightGradients`` records, for every such MatMul (a weight read
through ``ReadVariableOp``, optionally cast or reshaped, on the right-hand
side, no transposes), the microbatch's ``x_i`` and ``dy_i`` while the tape
computes ``dx_i`` only. Once every microbatch has run, each weight gradient
is one MatMul of the concatenated activations and output gradients,
``concat(x_i)^T @ concat(dy_i)``, on the stage's device, routed back to its
variable through the tape that recorded the read (so casts and reshapes of
the read are differentiated by TensorFlow). The result is the same sum in
one product. The tape hook that does the recording is
``hybridpar.compat.weight_gradient_split``; everything else (bias
gradients, convolutions, einsums, eager execution) takes the tape's usual
path.

Cost: each deferred layer keeps its ``dy_i`` until the step's weight
gradients run (the activations ``x_i`` are kept by the tapes anyway), so
this is used for pipelines (stages > 1), not for gradient accumulation,
whose point is the memory of one microbatch.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.framework import ops

from hybridpar.parallel.staging import STAGE_SCOPE_RE

_PASS_THROUGH = ("Identity", "Cast", "Reshape")


@dataclasses.dataclass
class _Read:
    microbatch: int
    weight: tf.Tensor  # the MatMul's right-hand input (a read of the variable)
    activations: tf.Tensor
    output_gradients: tf.Tensor


def _variable_handle(tensor: Any) -> tf.Tensor | None:
    """The resource handle ``tensor`` was read from, through casts and reshapes, if any."""
    if isinstance(tensor, ops.EagerTensor) or not isinstance(tensor, tf.Tensor):
        return None
    op = tensor.op
    while op.type in _PASS_THROUGH:
        op = op.inputs[0].op
    return op.inputs[0] if op.type == "ReadVariableOp" else None


def _attribute(attr_tuple: Sequence[Any], name: str) -> Any:
    attributes = dict(zip(attr_tuple[::2], attr_tuple[1::2], strict=True))
    return attributes.get(name)


class DeferredWeightGradients:
    """The weight-gradient MatMuls of one step's microbatches, recorded for one product each."""

    def __init__(self) -> None:
        self._reads: dict[tuple[Any, tuple], list[_Read]] = {}
        self._microbatch = 0

    @contextlib.contextmanager
    def recording(self, microbatch: int) -> Iterator[None]:
        """Defers the weight gradients the tape builds inside the block (microbatch ``i``)."""
        self._microbatch = microbatch
        token = _active.set(self)
        try:
            yield
        finally:
            _active.reset(token)

    def take(self, op_name: str, attr_tuple: Sequence[Any], inputs: Sequence[Any],
             out_grads: Sequence[Any]) -> bool:
        """Records ``op``'s weight gradient if it is a deferrable MatMul; True if it was."""
        if op_name != "MatMul" or len(inputs) != 2 or len(out_grads) != 1:
            return False
        if _attribute(attr_tuple, "transpose_a") or _attribute(attr_tuple, "transpose_b"):
            return False
        activations, weight = inputs
        gradient = out_grads[0]
        if not isinstance(gradient, tf.Tensor) or isinstance(gradient, ops.EagerTensor):
            return False
        handle = _variable_handle(weight)
        if handle is None:
            return False
        key = (handle.ref(), tuple(weight.shape.as_list()))
        self._reads.setdefault(key, []).append(
            _Read(self._microbatch, weight, activations, gradient)
        )
        return True

    def gradients(self, tapes: Sequence[tf.GradientTape], weights: Sequence[Any]) -> list[Any]:
        """The deferred part of each weight's gradient (``None`` where nothing was deferred).

        Args:
            tapes: the persistent tape of each microbatch, by index.
            weights: the trainable weights, as given to ``tape.gradient``.
        """
        targets: dict[int, tuple[list[tf.Tensor], list[tf.Tensor]]] = {}
        for reads in self._reads.values():
            first = reads[0]
            with tf.device(first.output_gradients.device), tf.name_scope(_scope(first)):
                product = tf.matmul(
                    tf.concat([read.activations for read in reads], 0),
                    tf.concat([read.output_gradients for read in reads], 0),
                    transpose_a=True,
                )
            reads_of, products = targets.setdefault(first.microbatch, ([], []))
            reads_of.append(first.weight)
            products.append(product)
        total: list[Any] = [None] * len(weights)
        for microbatch, (reads_of, products) in sorted(targets.items()):
            routed = tapes[microbatch].gradient(reads_of, list(weights), output_gradients=products)
            total = [_sum(a, b) for a, b in zip(total, routed, strict=True)]
        return total


def _scope(read: _Read) -> str:
    """``weight_gradients_stage<k>`` for a read of a stage-``k`` layer (profiles
    attribute the product to its stage), else ``weight_gradients``."""
    marker = STAGE_SCOPE_RE.search(read.weight.name)
    return "weight_gradients" if marker is None else f"weight_gradients_stage{marker[1]}"


def _sum(total: Any, gradient: Any) -> Any:
    if total is None or gradient is None:
        return gradient if total is None else total
    with tf.device(gradient.device):
        return total + gradient


_active: contextvars.ContextVar[DeferredWeightGradients | None] = contextvars.ContextVar(
    "hybridpar_deferred_weight_gradients", default=None
)


def active() -> DeferredWeightGradients | None:
    """The recorder of the microbatch backward being built now, if any."""
    return _active.get()

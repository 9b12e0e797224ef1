"""A tape sums the partial gradients of a tensor on the devices that made them.

Upstream (TF 2.21, ``_aggregate_grads`` in
``tensorflow/python/eager/backprop.py``, registered with the C++ tape as the
``aggregate_fn`` of its ``VSpace``): when a tensor feeds several ops, the
tape adds their gradients with one ``AddN`` built under the device scope
active at ``tape.gradient``, the replica's first device. With
model-parallel stages and tensor-parallel shards the partials were built on
their forward ops' devices (``stage_gradients``), so each partial crossed to
the first device to be summed, and the sum crossed back when its consumer
ran elsewhere: an activation used three times inside a shard (the tanh GELU)
moved four times, and a block input read by the query, key and value
projections of ``T`` shards moved ``3(T - 1)`` times instead of ``T - 1``.

Under a hybridpar strategy this fix sums partials that are all on one
device on that device, in upstream's order (the same bits); an
``IndexedSlices`` partial (an embedding lookup's) counts as on its values'
device, so a tied embedding shard's lookup and logits gradients are made
dense and added on the shard's device (upstream: on the first device). With
tensor-parallel groups it also groups partials from several devices by
device, sums each group on its own device, and adds the group sums where
upstream adds everything: another order, so rounding differs in the last
bits. Without tensor-parallel groups such sums stay as upstream builds them,
so a pipeline trains to the same bits as before (a residual that crosses
stages has partials on two devices). Installed with the ``stages`` group;
registered with the C++ tape on install, the original registered again when
removed.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import backprop
from tensorflow.python.framework import ops

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import state_of


def _register_with_tape(aggregate: Any) -> None:
    pywrap_tfe.TFE_Py_RegisterVSpace(backprop._default_vspace._replace(aggregate_fn=aggregate))


def _device_of(gradient: Any) -> str:
    """The device of a dense partial or of an ``IndexedSlices``'s values ("" if neither)."""
    if isinstance(gradient, tf.IndexedSlices):
        return gradient.values.device
    return gradient.device if isinstance(gradient, tf.Tensor) else ""


def _by_device(gradients: list[Any]) -> dict[str, list[Any]] | None:
    """The partials grouped by device, or ``None`` when one is not placed (or is neither a
    tensor nor an ``IndexedSlices``)."""
    groups: dict[str, list[Any]] = {}
    for gradient in gradients:
        device = _device_of(gradient)
        if not device:
            return None
        groups.setdefault(device, []).append(gradient)
    return groups


def _summed_where_made(original: Any) -> Any:
    @functools.wraps(original)
    def aggregate_grads(gradients):
        state = state_of(tf.distribute.get_strategy()) if len(gradients) > 1 else None
        groups = _by_device(gradients) if state is not None else None
        if groups is None or (len(groups) > 1 and state.plan.mesh.tensor == 1):
            return original(gradients)
        sums = []
        for device, partials in groups.items():
            with ops.device(device):
                sums.append(original(partials))
        return sums[0] if len(sums) == 1 else original(sums)

    return aggregate_grads


FIX = register(Fix(
    name="gradient_sums",
    corrects="a GradientTape sums a tensor's partial gradients on the device active at "
             "tape.gradient, not where the partials were built",
    group="stages",
    patches=(Patch(backprop, "_aggregate_grads", _summed_where_made,
                   after=_register_with_tape),),
))

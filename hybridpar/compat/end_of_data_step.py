"""The step that meets the end of the data changes nothing.

Upstream (TF 2.21 / Keras 3.15, any strategy): when ``fit`` reads an input of
unknown length (a ``filter``, a generator, TFRecord files), Keras runs one
more train function after the last batch, and its ``get_next`` ends the
epoch with ``OutOfRangeError``. The step's state updates that are not
computed from the batch do not wait for it: ``optimizer.iterations.assign_add(1)``
(and a seed generator's advance) runs before the missing batch aborts the
function. Every such epoch of 13 batches counts 14 optimizer steps (Adam's
bias correction and step-based learning-rate schedules then run one step
ahead), and under ``MirroredStrategy`` the increment reaches only some
replicas' copies before the abort, at random: the copies of ``iterations``
disagree (``[42, 41, 41, 41]`` after 3 epochs in one run of three, upstream
case), each device's Adam update uses its own, and the mirrored weights
drift apart.

In hybridpar's trainer each replica's training step runs under a control
dependency on its batch (``after_batch``), so nothing of it starts before
the batch exists: the step that meets the end of the data changes no state,
and an epoch of 13 batches counts 13 steps on every copy. TensorFlow's
replica threads carry the dependency into the optimizer's cross-replica
update (``merge_call`` runs under the control dependencies captured in the
replicas).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from hybridpar.compat.patching import Fix, register


@contextlib.contextmanager
def after_batch(data: Any) -> Iterator[None]:
    """Ops created inside wait for ``data`` (one replica's batch) to exist."""
    tensors = [t for t in tf.nest.flatten(data, expand_composites=True)
               if isinstance(t, tf.Tensor)]
    with tf.control_dependencies(tensors[:1]):  # one output of the batch's get_next
        yield


FIX = register(Fix(
    name="end_of_data_step",
    corrects="the step that meets the end of an input of unknown length still increments "
             "optimizer.iterations, under MirroredStrategy on some replicas' copies only",
    group="core",
    part_of="trainer_hooks",
))

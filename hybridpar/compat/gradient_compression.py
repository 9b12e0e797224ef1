"""``communication.compression`` creates its state before the first training step.

Not an upstream defect: ``tf.distribute`` has no gradient compression
(``CommunicationOptions`` holds pack size, timeout and implementation only;
tensorflow/tensorflow#40468 was closed as stale). hybridpar compresses in its
own gradient all-reduce (``gradient_all_reduce`` hands each stage group to
``hybridpar.parallel.compression``). PowerSGD needs per-replica variables
(error memory and warm-start factors). The trainer's ``make_train_function``
(``hybridpar.training``), the point after Keras built the model and its
optimizer (``fit``, ``train_on_batch``) and before the first trace, creates
them eagerly for models under a strategy
hybridpar built with ``compression: powersgd``, so that the traced step
creates no variables. (A custom training loop gets them from its first step,
through ``merge_call``; checkpoint restores create them too.)

It does so after ``microbatch_step``'s checks, just before Keras builds the
function.
"""

from __future__ import annotations

from hybridpar.compat.patching import Fix, register

FIX = register(Fix(
    name="gradient_compression",
    corrects="tf.distribute has no gradient compression; PowerSGD's per-replica state must "
             "exist before the train step is traced",
    group="core",
    upstream="tensorflow/tensorflow#40468",
    part_of="trainer_hooks",
))

"""The 1F1B order of a pipelined step, as control dependencies (``model_parallel.schedule: 1f1b``).

In a ``tf.function`` TensorFlow runs an op as soon as its inputs are ready,
so stage 0 runs every microbatch's forward before the first backward comes
back, and each stage holds all M microbatches' activations (GPipe). 1F1B
(PipeDream-flush) lets stage ``k`` start the forward of microbatch ``m`` only
once the backward of microbatch ``m - (stages - k)`` has run there
(``schedule.forward_waits_for``): the tensors that backward consumed are
freed, so stage ``k`` holds at most ``stages - k`` microbatches' activations.
The step computes the same sums in the same order of microbatches.

``StageGates`` records, after each microbatch's ``tape.gradient`` and the
sum of its gradients into the step's, the ops built on each stage's device
(a stage's device is read from the names of the backward ops on it:
``gradient_tape/<microbatch scope>/.../hybridpar_stage<k>/``) as one
``NoOp``. The sums belong there (measured: with them outside the gate,
1F1B's allocator peak at M=8 was 4.4 x GPipe's, as if every microbatch's
weight gradient stayed alive until the last, which is what Grappler's
merging of an ``Add`` chain into one ``AddN`` would do; a sum that drives a
control dependency is not merged); while a microbatch's forward is built, ``waiting(stage)`` (opened
by ``hybridpar.compat.stage_calls`` around each staged layer call) makes the
layer's ops wait for the ``NoOp`` the schedule names. Eager execution runs
the ops in program order and needs none of it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from hybridpar.parallel.schedule import forward_waits_for
from hybridpar.parallel.staging import STAGE_SCOPE_RE


class StageGates:
    """The backward ``NoOp`` of each (microbatch, stage) of one step, and the waits on them.

    Args:
        stages: model-parallel stages per replica.
    """

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self._done: dict[tuple[int, int], tf.Operation] = {}
        self._microbatch: int | None = None

    @contextlib.contextmanager
    def forward(self, microbatch: int) -> Iterator[None]:
        """Staged layer calls inside the block are microbatch ``microbatch``'s forward."""
        self._microbatch = microbatch
        token = _active.set(self)
        try:
            yield
        finally:
            _active.reset(token)
            self._microbatch = None

    @contextlib.contextmanager
    def backward(self, microbatch: int, scope: str) -> Iterator[None]:
        """Records the ops built inside the block on each stage's device.

        Args:
            microbatch: the microbatch whose gradients the block builds.
            scope: the name scope its forward ran in (``microbatch<i>/``, with
                the replica's prefix), which TensorFlow's tape puts after
                ``gradient_tape/`` in every backward op's name.
        """
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        yield
        built = graph.get_operations()[first:]
        prefix = f"gradient_tape/{scope}"
        stage_of_device: dict[str, int] = {}
        for op in built:
            marker = STAGE_SCOPE_RE.search(op.name) if op.name.startswith(prefix) else None
            if marker is not None and op.device:
                stage_of_device.setdefault(op.device, int(marker[1]))
        by_stage: dict[int, list[tf.Operation]] = {}
        for op in built:
            if op.device in stage_of_device:
                by_stage.setdefault(stage_of_device[op.device], []).append(op)
        for stage, ops in by_stage.items():
            with tf.device(ops[-1].device), tf.control_dependencies(ops):
                self._done[microbatch, stage] = tf.no_op(
                    name=f"backward{microbatch}_stage{stage}_done"
                )

    def waits(self, stage: int) -> list[tf.Operation]:
        """What the forward being built on ``stage`` waits for (empty: nothing)."""
        if self._microbatch is None:
            return []
        waited = forward_waits_for(self._microbatch, stage, self.stages)
        done = None if waited is None else self._done.get((waited, stage))
        return [] if done is None else [done]


_active: contextvars.ContextVar[StageGates | None] = contextvars.ContextVar(
    "hybridpar_stage_gates", default=None
)


def forward(gates: StageGates | None, microbatch: int) -> contextlib.AbstractContextManager:
    """``gates.forward(microbatch)``, or nothing under GPipe (``gates`` is ``None``)."""
    return contextlib.nullcontext() if gates is None else gates.forward(microbatch)


def backward(gates: StageGates | None, microbatch: int,
             scope: str) -> contextlib.AbstractContextManager:
    """``gates.backward(microbatch, scope)``, or nothing under GPipe or eagerly."""
    if gates is None or tf.executing_eagerly():
        return contextlib.nullcontext()
    return gates.backward(microbatch, scope)


@contextlib.contextmanager
def waiting(stage: int) -> Iterator[None]:
    """Makes the ops built inside wait for what 1F1B orders before this stage's forward."""
    gates = _active.get()
    waits: list[Any] = [] if gates is None or tf.executing_eagerly() else gates.waits(stage)
    if not waits:
        yield
        return
    with tf.control_dependencies(waits):
        yield

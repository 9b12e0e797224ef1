"""``fit``'s training input read through one ``tf.data`` iterator per worker, which a
checkpoint can save.

Upstream (TF 2.21, ``input_lib._SingleWorkerOwnedDatasetIterator``): under a
``tf.distribute`` strategy Keras's ``fit`` reads a ``DistributedIterator``,
whose per-worker ``OwnedMultiDeviceIterator`` has no saveable state, and
whose background thread reads ahead of training into per-device buffers, so
not even the state of the dataset it reads would name the position trained.
A resume could only replay the batches already trained.

A ``ResumableDataset`` feeds the same pieces of every global batch to the
same replicas (the worker's piece dataset, built by ``strategies.even_batches``),
but from one plain ``tf.data`` iterator on the worker's host, which the training
step itself draws from (``StepInput``: the worker's replicas' pieces, each
copied to its replica's device, regrouped as TensorFlow's iterator regroups
them). Nothing reads ahead of training but the pipeline's own buffers
(``prefetch``, ``shuffle``), which are part of the iterator's state: the state
at a step boundary is exactly the input's position, so a checkpoint saves it
(``ResumableIterator.state``) and a resume restores it (``restore``) instead
of replaying batches. A pipeline with an op that holds state of its own (a
Python generator, a ``py_function``, a stateful random op) raises
``tf.errors.FailedPreconditionError`` from ``state`` unless that op's state may
be left out (``hybridpar.checkpoint.input_state`` decides).

The cost: no prefetch to the replicas' devices beyond the pipeline's own
(on accelerators the copy of each step's pieces is part of the step).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import input_lib
from tensorflow.python.ops import gen_dataset_ops

from hybridpar.data import pipeline_digest


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """How one worker's iterator feeds its replicas (hashable: a ``tf.function`` argument).

    Attributes:
        local: pieces drawn per step, one per replica of this worker.
        agree: whether every step agrees over the workers on whether any of
            them still has data, as TensorFlow's distributed iterator does (with
            the same collective); a worker whose input ended (each worker reads
            its own files) then gives its replicas empty pieces.
        whole: every global batch reaches this worker's iterator (one worker, or
            every worker reading every batch), so the epoch's length is its length.
    """

    local: int
    agree: bool = False
    whole: bool = True


class StepInput:
    """A worker's pieces for one step, drawn from its host iterator (usable while tracing).

    Args:
        strategy: the strategy whose replicas the pieces go to.
        host: the worker's ``tf.data`` iterator of pieces.
        layout: how the pieces feed the replicas.
    """

    def __init__(self, strategy: tf.distribute.Strategy, host: Any,
                 layout: InputLayout) -> None:
        self.strategy = strategy
        self.host = host
        self.layout = layout
        self._workers = strategy.extended._input_workers_with_options()

    def _devices(self) -> tuple[str, ...]:
        return tuple(self._workers.compute_devices_for_worker(0))

    def _placed(self, values: list[Any]) -> Any:
        """The pieces copied to their replicas' devices, as TensorFlow's iterator gives them."""
        placed = []
        for device, value in zip(self._devices(), values, strict=True):
            with tf.device(device):
                placed.append(tf.nest.map_structure(tf.identity, value))
        return input_lib._create_per_replica(placed, self.strategy)

    def _optionals(self) -> list[Any]:
        with tf.device(self._workers.worker_devices[0]):
            return [self.host.get_next_as_optional() for _ in range(self.layout.local)]

    def _values_or_empty(self, optionals: list[Any]) -> Any:
        values = input_lib._get_value_or_dummy(self._workers, [optionals], produce_dummy=True)
        return input_lib._create_per_replica(values, self.strategy)

    def _with_values(self, optionals: list[Any]) -> tf.Tensor:
        return input_lib._calculate_replicas_with_values(self.strategy, self._workers,
                                                         [optionals])

    def _drawn(self) -> Any:
        with tf.device(self._workers.worker_devices[0]):
            values = [self.host.get_next() for _ in range(self.layout.local)]
        return self._placed(values)

    def get_next(self) -> Any:
        """The step's per-replica pieces; ``tf.errors.OutOfRangeError`` once the data ended."""
        if not self.layout.agree:
            return self._drawn()
        optionals = self._optionals()
        # No worker has data: get_next on the ended iterator raises the end of the data.
        return tf.cond(self._with_values(optionals) > 0,
                       lambda: self._values_or_empty(optionals), self._drawn)

    def get_next_as_optional(self) -> tf.experimental.Optional:
        """The step's per-replica pieces as an Optional, empty once the data ended."""
        spec = input_lib._create_distributed_tensor_spec(self.strategy,
                                                         self.host.element_spec)
        optionals = self._optionals()
        if self.layout.agree:
            present = self._with_values(optionals) > 0

            def value() -> Any:
                return tf.experimental.Optional.from_value(self._values_or_empty(optionals))
        else:  # a worker's pieces come in whole steps: all of them or none
            present = optionals[0].has_value()

            def value() -> Any:
                return tf.experimental.Optional.from_value(
                    self._placed([o.get_value() for o in optionals]))

        return tf.cond(present, value, lambda: tf.experimental.Optional.empty(spec))


class ResumableDataset:
    """A worker's input for ``fit``: its pieces, and how they feed its replicas.

    Keras's epoch iterator holds it where it would hold TensorFlow's distributed
    dataset, and draws a ``ResumableIterator`` from it every epoch.

    Args:
        strategy: the strategy whose replicas it feeds.
        pieces: this worker's pieces of the global batches, ``layout.local`` per step.
        layout: how the pieces feed the replicas.
        fingerprint: what a saved state is valid for (workers, replicas, sharding
            and pieces); a checkpoint written for another is replayed instead.
        source: the dataset ``fit`` received, whose pipeline a saved state is valid
            for too (``digest``).
    """

    def __init__(self, strategy: tf.distribute.Strategy, pieces: tf.data.Dataset,
                 layout: InputLayout, fingerprint: str,
                 source: tf.data.Dataset | None = None) -> None:
        self.strategy = strategy
        self.pieces = pieces
        self.layout = layout
        self.fingerprint = fingerprint
        self.source = pieces if source is None else source

    @functools.cached_property
    def digest(self) -> str:
        """The source pipeline's structural digest (``pipeline_digest``), taken once, at the
        first save or restore."""
        return pipeline_digest.digest(self.source)

    @property
    def element_spec(self) -> Any:
        """One replica's piece (what ``symbolic_build`` builds the model from)."""
        return self.pieces.element_spec

    def host_device(self) -> str:
        """Where the iterator lives: this worker's host."""
        return self.strategy.extended._input_workers_with_options().worker_devices[0]

    def __iter__(self) -> ResumableIterator:
        with tf.device(self.host_device()):
            return ResumableIterator(self, iter(self.pieces))


class ResumableIterator:
    """One epoch's (or, over a repeated dataset, several epochs') iterator of a worker."""

    def __init__(self, dataset: ResumableDataset, host: Any) -> None:
        self.dataset = dataset
        self.host = host
        self.layout = dataset.layout
        self._step = StepInput(dataset.strategy, host, dataset.layout)
        self._end_error: Callable[[], Exception] | None = None

    def __iter__(self) -> ResumableIterator:
        return self

    def __next__(self) -> Any:
        try:
            return self.get_next()
        except tf.errors.OutOfRangeError:
            raise StopIteration from None

    def get_next(self) -> Any:
        """The next step's per-replica pieces (eagerly; traced steps use ``StepInput``)."""
        return self._step.get_next()

    def get_next_as_optional(self) -> tf.experimental.Optional:
        """The next step's per-replica pieces as an Optional."""
        return self._step.get_next_as_optional()

    def state(self, external_state: bool = False) -> tf.Tensor:
        """The iterator's state as a string tensor on the host: the pipeline's position and
        its buffers.

        Args:
            external_state: save it even where an op of the pipeline holds state of its
                own (a stateful random op, a Python function), which is not saved.

        Raises:
            tf.errors.FailedPreconditionError: without ``external_state``, for a pipeline
                with such an op, naming it ("RandomShuffle is stateful").
        """
        policy = tf.data.experimental.ExternalStatePolicy.IGNORE if external_state else (
            tf.data.experimental.ExternalStatePolicy.FAIL)
        with tf.device(self.dataset.host_device()):
            variant = gen_dataset_ops.serialize_iterator(self.host._iterator_resource,
                                                         policy.value)
            return tf.io.serialize_tensor(variant)

    def restore(self, state: Any) -> None:
        """Puts the iterator where ``state`` (of ``state``, for the same pipeline) says.

        Raises:
            tf.errors.OpError: when ``state`` is not the state of this pipeline.
        """
        with tf.device(self.dataset.host_device()):
            variant = tf.io.parse_tensor(tf.convert_to_tensor(state, tf.string), tf.variant)
            gen_dataset_ops.deserialize_iterator(self.host._iterator_resource, variant)

    def expect_steps_after_restore(self, error: Callable[[], Exception]) -> None:
        """Has ``first_step_after_restore`` raise ``error()`` where the input ends at once.

        (Drawing a piece to see, and restoring the state over it, changed the next
        epoch's reshuffled order of a BERT pipeline: the check waits for fit's own step.)
        """
        self._end_error = error

    def first_step_after_restore(self, step: Callable[[Any], Any]) -> Any:
        """``step(self)``, fit's first train call after a restore; where the input ends in
        it before any step and ``expect_steps_after_restore`` was called, that error.

        Raises:
            Exception: the expected error, in place of Keras's end of the epoch
                (``StopIteration``, ``OutOfRangeError``), which would end it with 0 steps.
        """
        error, self._end_error = self._end_error, None
        try:
            return step(self)
        except (StopIteration, tf.errors.OutOfRangeError):
            if error is None:
                raise
            raise error() from None

    def skip(self, steps: int) -> None:
        """Draws the pieces of ``steps`` steps without training on them (or up to the end)."""
        with tf.device(self.dataset.host_device()):
            _draw_pieces(self.host, tf.constant(steps * self.layout.local, tf.int64))


@tf.function
def _draw_pieces(host: Any, count: tf.Tensor) -> tf.Tensor:
    drawn = tf.constant(0, tf.int64)
    while drawn < count:
        if not host.get_next_as_optional().has_value():
            break
        drawn += 1
    return drawn

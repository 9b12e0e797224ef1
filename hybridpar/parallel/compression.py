"""Gradient compression in the gradient all-reduce of hybridpar's strategies.

``tf.distribute`` has none (``CommunicationOptions`` holds pack size, timeout
and implementation only; tensorflow/tensorflow#40468 was closed as stale).
``communication.compression`` plugs into hybridpar's gradient all-reduce
(``compat.gradient_all_reduce``), once per stage group:

- ``fp16`` / ``bf16``: each float32/float64 gradient is divided by the number
  of replicas (so the sum of values that fit cannot overflow, as PyTorch's
  ``fp16_compress_hook`` does), cast, all-reduced in the low dtype inside the
  one batched all-reduce, cast back and multiplied again. inf and nan survive
  both casts, so an overflowing step stays non-finite for a loss-scale
  optimizer; a finite value beyond the low dtype's range becomes inf
  (float16 holds up to 65504 per replica share; bfloat16 has float32's range).
- ``powersgd``: ``hybridpar.parallel.powersgd``.

``from_config`` decides where compression applies; the run log says once per
optimizer what is compressed (``compression_plan``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from hybridpar.config import CommunicationConfig, StrategyConfig
from hybridpar.parallel.all_reduce import all_reduce_sum
from hybridpar.parallel.compression_plan import CompressionReport, plan
from hybridpar.parallel.powersgd import PowerSGDState, spec_of
from hybridpar.topology.plan import Plan

logger = logging.getLogger("hybridpar")

LOW_DTYPES = {"fp16": tf.float16, "bf16": tf.bfloat16}
FLOATING = (tf.float32, tf.float64)

Pairs = list[tuple[Any, Any]]


def from_config(config: StrategyConfig, strategy_plan: Plan) -> GradientCompression | None:
    """The compression of a strategy about to be built, or ``None`` when there is none.

    With one replica nothing is all-reduced: a warning says so and training
    runs uncompressed. ``topology.plan`` already refused compression in
    parameter-server mode, which has no all-reduce.
    """
    settings = config.communication
    if settings.compression == "none":
        return None
    if strategy_plan.num_replicas == 1:
        logger.warning(
            "hybridpar: communication.compression=%r has no effect with 1 replica (nothing is "
            "all-reduced); training uncompressed.", settings.compression,
        )
        return None
    return GradientCompression(settings)


def innermost(optimizer: Any) -> Any:
    """The optimizer whose gradient all-reduce runs (inside a LossScaleOptimizer, its inner)."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


def to_wire(gradient: Any, dtype: tf.DType, replicas: int) -> Any:
    """``gradient / replicas`` in ``dtype`` (dense or ``IndexedSlices``)."""
    if isinstance(gradient, tf.IndexedSlices):
        values = tf.cast(gradient.values / replicas, dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return tf.cast(gradient / replicas, dtype)


def from_wire(reduced: Any, dtype: tf.DType, replicas: int) -> Any:
    """The all-reduced ``to_wire`` values back in ``dtype`` and scale."""
    if isinstance(reduced, tf.IndexedSlices):
        values = tf.cast(reduced.values, dtype) * replicas
        return tf.IndexedSlices(values, reduced.indices, reduced.dense_shape)
    return tf.cast(reduced, dtype) * replicas


class GradientCompression:
    """``communication.compression`` of one strategy.

    Holds each optimizer's PowerSGD state and the latest report, and gives
    ``compat.gradient_all_reduce`` the all-reduce of a stage group.

    Args:
        settings: the ``communication`` section (compression is not ``none``).
    """

    def __init__(self, settings: CommunicationConfig) -> None:
        self.kind = settings.compression
        self.powersgd = settings.powersgd_settings
        self.report: CompressionReport | None = None
        self._states: weakref.WeakKeyDictionary[Any, PowerSGDState] = weakref.WeakKeyDictionary()
        self._logged: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ PowerSGD state

    def prepare(self, model: Any) -> None:
        """Creates PowerSGD's state for ``model``'s optimizer (built first) if it has none."""
        optimizer = getattr(model, "optimizer", None)
        if self.kind == "powersgd" and optimizer is not None:
            self.prepare_optimizer(model.distribute_strategy, optimizer,
                                   model.trainable_variables)

    def prepare_optimizer(self, strategy: tf.distribute.Strategy, optimizer: Any,
                          variables: Sequence[Any]) -> None:
        """``prepare`` for an optimizer that trains ``variables``, in cross-replica context."""
        inner = innermost(optimizer)
        if self.kind != "powersgd" or inner in self._states:
            return
        with strategy.scope():
            if not optimizer.built:
                optimizer.build(list(variables))
            self._states[inner] = PowerSGDState(strategy, variables, self.powersgd,
                                                inner.iterations)

    def state_for(self, optimizer: Any) -> PowerSGDState | None:
        """The PowerSGD state of ``optimizer`` (or of the optimizer it wraps), if any."""
        return self._states.get(innermost(optimizer)) if optimizer is not None else None

    # ------------------------------------------------------------------ the all-reduce

    def reducer(self, optimizer: Any, present: Pairs) -> Callable[[Pairs, Any], list[Any]]:
        """The all-reduce of one stage group's pairs for ``optimizer``'s step: called with
        the pairs and the group's collectives (``all_reduce.all_reduce_sum``'s ``group``).

        ``present`` (every gradient of the step) is reported once per optimizer.
        PowerSGD's state is created here if nothing created it before the
        first step (a custom training loop).
        """
        self._describe(optimizer, present)
        if self.kind != "powersgd":
            return self._cast_reduce
        state = self.state_for(optimizer)
        if state is None:
            state = self._created_in_step(optimizer, [variable for _, variable in present])
        return state.reduce

    def _created_in_step(self, optimizer: Any, variables: list[Any]) -> PowerSGDState:
        """Creates the state from inside the traced step (a custom training loop): in
        cross-replica context through ``merge_call``, eagerly through ``tf.init_scope``."""
        @tf.autograph.experimental.do_not_convert  # runs eagerly, under tf.init_scope
        def create(strategy: tf.distribute.Strategy) -> None:
            with tf.init_scope():
                self.prepare_optimizer(strategy, optimizer, variables)

        tf.distribute.get_replica_context().merge_call(create)
        return self.state_for(optimizer)

    def _cast_reduce(self, pairs: Pairs, group: Any = None) -> list[Any]:
        low = LOW_DTYPES[self.kind]
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        cast = [variable is not None and gradient.dtype in FLOATING
                for gradient, variable in pairs]
        sent = [to_wire(gradient, low, replicas) if c else gradient
                for (gradient, _), c in zip(pairs, cast, strict=True)]
        reduced = all_reduce_sum(sent, group=group)
        return [from_wire(r, gradient.dtype, replicas) if c else r
                for r, (gradient, _), c in zip(reduced, pairs, cast, strict=True)]

    def _describe(self, optimizer: Any, present: Pairs) -> None:
        specs = [spec_of(getattr(variable, "name", "?"), variable.shape, gradient.dtype,
                         sparse=isinstance(gradient, tf.IndexedSlices))
                 for gradient, variable in present]
        settings = self.powersgd
        self.report = plan(specs, self.kind, settings.rank, settings.min_elements)
        summary = self.report.summary()
        key = innermost(optimizer)
        if self._logged.get(key) != summary:
            self._logged[key] = summary
            logger.info("hybridpar: %s", summary)

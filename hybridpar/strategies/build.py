"""The strategy a checked config asks for, one builder per mode.

Every check of the config against the runtime ran in ``topology.plan``; the
builders here trust the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from hybridpar.compat import check_versions, hold
from hybridpar.compat.trainer_hooks import check_hooks
from hybridpar.state import StrategyState
from hybridpar.strategies import multi_worker, parameter_server
from hybridpar.strategies.evaluator import EvaluatorRunner
from hybridpar.strategies.mirrored import HybridMirroredStrategy, HybridOneDeviceStrategy
from hybridpar.training import Trainer

logger = logging.getLogger("hybridpar")


def _one_device(state: StrategyState) -> tf.distribute.Strategy:
    return HybridOneDeviceStrategy(state, state.plan.mesh.devices[0])


def _mirrored(state: StrategyState) -> tf.distribute.Strategy:
    ring = state.config.communication.implementation == "ring"
    return HybridMirroredStrategy(state, state.plan.mesh.stage_devices(0), ring=ring)


BUILDERS: dict[str, Callable[[StrategyState], tf.distribute.Strategy]] = {
    "none": _one_device,
    "mirrored": _mirrored,
    "multi_worker": multi_worker.build,
    "parameter_server": parameter_server.build,
}


def build_strategy(state: StrategyState) -> tf.distribute.Strategy:
    """Builds the strategy for ``state`` and installs the Keras fixes it needs while it lives.

    Raises:
        RuntimeError: on a TensorFlow/Keras line the fixes were not verified on,
            or a Keras that lacks a method the trainer hooks into.
    """
    check_versions()
    check_hooks()
    state.trainer = Trainer(state)
    strategy = BUILDERS[state.mode](state)
    hold("core", strategy)
    if state.stages > 1 or state.plan.mesh.tensor > 1:
        hold("stages", strategy)
    if state.mode == "parameter_server":
        hold("parameter_server", strategy)
    if state.mode == "parameter_server" or state.plan.mesh.tensor > 1:
        hold("split_weights", strategy)
    if state.is_evaluator:
        state.runner = EvaluatorRunner(state)
    training = state.plan.cluster_mode
    training = training if training in ("multi_worker", "parameter_server") else "single-process"
    role = (f" (the evaluator of {training} training: evaluates checkpoints, trains nothing)"
            if state.is_evaluator else "")
    logger.info(
        "hybridpar: mode=%s replicas=%d stages=%d microbatches=%d devices=%s%s",
        state.mode,
        strategy.num_replicas_in_sync,
        state.stages,
        state.microbatches,
        ",".join(state.plan.mesh.devices),
        role,
    )
    return strategy

"""``fit``/``evaluate``/``predict`` of models under hybridpar's parameter-server strategy.

Upstream (Keras 3.15): nothing in Keras 3 schedules work on the workers of a
ParameterServerStrategy (keras-team/keras#18624); ``fit`` fails with "To use
this dataset, you need to pass this dataset to
ClusterCoordinator.create_per_worker_dataset". Models whose strategy hybridpar
built for parameter servers go to that strategy's runner
(``hybridpar.strategies.ps_training``), which uses Keras's own evaluate and
predict on the chief inside ``keras_path()``.

Upstream (TF 2.21, ``ParameterServerStrategyV2``): a distributed dataset can
only be iterated on workers, and ``run`` outside ``ClusterCoordinator.schedule``
warns on every step. Inside ``on_chief(strategy)`` hybridpar's strategy
hands datasets to Keras unchanged and runs steps on the chief.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import state_of

_keras_path: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hybridpar_keras_path", default=False
)
_on_chief: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hybridpar_on_chief", default=None
)


@contextlib.contextmanager
def keras_path() -> Iterator[None]:
    """Within the block, ``fit``/``evaluate``/``predict`` run Keras's own code."""
    token = _keras_path.set(True)
    try:
        yield
    finally:
        _keras_path.reset(token)


def is_on_chief(strategy: tf.distribute.Strategy) -> bool:
    """True inside ``on_chief(strategy)``."""
    return _on_chief.get() is strategy


@contextlib.contextmanager
def on_chief(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Runs ``strategy.run`` on the chief, without the "not scheduled" warning per step."""
    token = _on_chief.set(strategy)
    extended = strategy.extended
    previous = extended._allow_run_without_coordinator
    extended._allow_run_without_coordinator = True
    try:
        yield
    finally:
        extended._allow_run_without_coordinator = previous
        _on_chief.reset(token)


def _routed(name: str) -> Any:
    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            state = state_of(getattr(self, "_distribute_strategy", None))
            if state is None or state.runner is None or _keras_path.get():
                return original(self, *args, **kwargs)
            return getattr(state.runner, name)(self, *args, **kwargs)

        return method

    return wrap


FIX = register(Fix(
    name="ps_routing",
    corrects="Keras 3 has no parameter-server path: fit fails on the per-worker dataset",
    upstream="keras-team/keras#18624",
    group="parameter_server",
    patches=tuple(Patch(keras_tf_trainer.TensorFlowTrainer, name, _routed(name))
                  for name in ("fit", "evaluate", "predict")),
))

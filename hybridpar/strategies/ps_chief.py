"""On the parameter-server chief, Keras's own evaluate and predict run steps on the chief.

Upstream (TF 2.21, ``ParameterServerStrategyV2``): a distributed dataset can
only be iterated on workers, and ``run`` outside ``ClusterCoordinator.schedule``
warns on every step. The chief's ``evaluate`` and ``predict``
(``hybridpar.strategies.ps_training``) run Keras's own loops inside
``on_chief(strategy)``, where hybridpar's strategy hands datasets to Keras
unchanged and runs steps on the chief. An override: only hybridpar's
``HybridParameterServerStrategy`` consults it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

_on_chief: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hybridpar_on_chief", default=None
)


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

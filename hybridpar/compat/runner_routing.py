"""``fit``/``evaluate``/``predict`` of models under a strategy with a runner go to that runner.

Upstream (Keras 3.15): Keras 3's trainer has no parameter-server path
(keras-team/keras#18624): under ``ParameterServerStrategy`` nothing schedules
work on the workers and ``fit`` fails with "To use this dataset, you need to
pass this dataset to ClusterCoordinator.create_per_worker_dataset". Nor has
it sidecar evaluation: tf_keras's ``SidecarEvaluator`` has no Keras 3
counterpart, so a script run on an ``evaluator`` task has nothing to call.

A strategy hybridpar built may carry a runner in its ``StrategyState``: the
parameter-server chief's (``strategies.ps_training``) or the evaluator's
(``strategies.evaluator``). The trainer (``hybridpar.training``, reached
through ``trainer_hooks``) sends ``fit``/``evaluate``/``predict`` of a model
under such a strategy to the runner's method of the same name; a runner runs
Keras's own code inside ``keras_path()``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from hybridpar.compat.patching import Fix, register

_keras_path: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hybridpar_keras_path", default=False
)


@contextlib.contextmanager
def keras_path() -> Iterator[None]:
    """Within the block, ``fit``/``evaluate``/``predict`` run Keras's own code."""
    token = _keras_path.set(True)
    try:
        yield
    finally:
        _keras_path.reset(token)


def on_keras_path() -> bool:
    """True inside ``keras_path()``: ``fit``/``evaluate``/``predict`` run Keras's own code."""
    return _keras_path.get()


FIX = register(Fix(
    name="runner_routing",
    corrects="Keras 3 has no parameter-server path (fit fails on the per-worker dataset) "
             "and no sidecar evaluation",
    upstream="keras-team/keras#18624",
    group="core",
    part_of="trainer_hooks",
))

"""``model_parallel.microbatches > 1`` (and a padded batch) runs hybridpar's train step.

Not an upstream defect: Keras 3 has no pipelining, and its train step is the
one place a batch can be split into microbatches under the unmodified
``model.fit``. For models under a strategy hybridpar built with
``microbatches > 1``, or whose replica holds a balanced piece of a split
batch (``even_batches``: its padding must get no weight in the metrics and
the loss tracker, see ``padded_steps``), the trainer's ``train_step``
(``hybridpar.training``, through ``trainer_hooks``) runs
``hybridpar.parallel.pipeline.train_step`` instead of Keras's.

``make_train_function`` is the first point where a model is complete (all
its layers known and built) before its first step. There, once per model,
the trainer runs ``check_before_training``: a model class that overrides
``train_step`` while ``microbatches > 1`` is refused (its own step would
silently ignore the microbatches), placement rules that match no layer are
reported, and the placement report is logged with stages > 1. Checks come
before the state they would make useless (``gradient_compression``'s).
"""

from __future__ import annotations

import logging
from typing import Any

from hybridpar import report
from hybridpar.compat.patching import Fix, register
from hybridpar.errors import ConfigError
from hybridpar.state import StrategyState

logger = logging.getLogger("hybridpar")


def own_train_step(model: Any) -> type | None:
    """The user class that overrides Keras's ``train_step``, or ``None``."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            return None if cls.__module__.startswith("keras.") else cls
    return None


def check_before_training(model: Any, state: StrategyState) -> None:
    """The checks of a complete model before its first step (see the module doc).

    Raises:
        ConfigError: for a model class with its own ``train_step`` while
            ``microbatches > 1``; for placement rules that match no layer.
    """
    custom = own_train_step(model)
    if custom is not None and state.microbatches > 1:
        raise ConfigError(
            f"{custom.__qualname__} overrides train_step, so hybridpar cannot split "
            "its batches into microbatches. Received: "
            f"model_parallel.microbatches={state.microbatches}. Set "
            "model_parallel.microbatches to 1, or remove the train_step override "
            "(hybridpar's microbatched step then runs Keras's)."
        )
    described = report.describe(model, state.placer)
    if state.stages > 1:
        logger.info("%s", described)


FIX = register(Fix(
    name="microbatch_step",
    corrects="Keras 3 has no pipelining: its train step cannot split a batch into microbatches",
    group="core",
    part_of="trainer_hooks",
))

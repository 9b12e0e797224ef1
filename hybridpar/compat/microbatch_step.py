"""``model_parallel.microbatches > 1`` (and a padded batch) runs hybridpar's train step.

Not an upstream defect: Keras 3 has no pipelining, and its train step is the
one place a batch can be split into microbatches under the unmodified
``model.fit``. For models under a strategy hybridpar built with
``microbatches > 1``, or whose replica holds a balanced piece of a split
batch (``even_batches``: its padding must get no weight in the metrics and
the loss tracker, see ``padded_steps``), ``TensorFlowTrainer.train_step``
runs ``hybridpar.parallel.pipeline.train_step`` instead.

``make_train_function`` is the first point where a model is complete (all
its layers known and built) before its first step. This fix owns the one
patch of it, which runs, in this order, before Keras's own:

1. ``model_scope``: a model whose variables are not the strategy's is
   refused (this acts on models that are not hybridpar's too);
2. for models under a hybridpar strategy, once: a model class that overrides
   ``train_step`` while ``microbatches > 1`` is refused (its own step would
   silently ignore the microbatches), placement rules that match no layer
   are reported, and the placement report is logged with stages > 1;
3. ``gradient_compression``: PowerSGD's per-replica state is created.

Checks come before the state they would make useless. The three used to be
three patches of the attribute, each wrapping the previous one's
replacement as its "original": correct only while they were reverted in the
reverse order of installing; reverted in any other (a fix registered while
its group was held is applied last), one would put back another's wrapper
for good. One patch has one original: Keras's.
"""

from __future__ import annotations

import logging
from typing import Any

from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar import report
from hybridpar.compat import gradient_compression, model_scope, replica_share
from hybridpar.compat.patching import Fix, Patch, compose, guarded, register
from hybridpar.errors import ConfigError
from hybridpar.parallel import pipeline
from hybridpar.state import state_of

logger = logging.getLogger("hybridpar")


def own_train_step(model: Any) -> type | None:
    """The user class that overrides Keras's ``train_step``, or ``None``."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            return None if cls.__module__.startswith("keras.") else cls
    return None


def _kept_rows() -> Any:
    share = replica_share.current_share()
    return None if share is None else share.keep


def _splits_batches(self, *args, **kwargs) -> bool:
    state = state_of(self._distribute_strategy)
    return state is not None and (state.microbatches > 1 or _kept_rows() is not None)


def _microbatched(original: Any) -> Any:
    def train_step(self, data):
        state = state_of(self._distribute_strategy)
        return pipeline.train_step(
            self, data, state.microbatches, sequential=state.stages == 1, keep=_kept_rows(),
            schedule=state.config.model_parallel.schedule, stages=state.stages,
        )

    return train_step


def _unchecked(self, *args: Any, **kwargs: Any) -> bool:
    return (state_of(self._distribute_strategy) is not None
            and not getattr(self, "_hybridpar_checked", False))


def _checked_before_training(original: Any) -> Any:
    def make_train_function(self, *args, **kwargs):
        state = state_of(self._distribute_strategy)
        custom = own_train_step(self)
        if custom is not None and state.microbatches > 1:
            raise ConfigError(
                f"{custom.__qualname__} overrides train_step, so hybridpar cannot split "
                "its batches into microbatches. Received: "
                f"model_parallel.microbatches={state.microbatches}. Set "
                "model_parallel.microbatches to 1, or remove the train_step override "
                "(hybridpar's microbatched step then runs Keras's)."
            )
        described = report.describe(self, state.placer)
        if state.stages > 1:
            logger.info("%s", described)
        self._hybridpar_checked = True
        return original(self, *args, **kwargs)

    return make_train_function


FIX = register(Fix(
    name="microbatch_step",
    corrects="Keras 3 has no pipelining: its train step cannot split a batch into microbatches",
    group="core",
    patches=(
        Patch(keras_tf_trainer.TensorFlowTrainer, "train_step", _microbatched,
              owns=_splits_batches),
        Patch(keras_tf_trainer.TensorFlowTrainer, "make_train_function", compose(
            model_scope.checked_step("fit"),
            guarded(_checked_before_training, _unchecked),
            gradient_compression.prepared,
        )),
    ),
))


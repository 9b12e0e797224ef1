"""The Keras methods hybridpar's trainer answers for: one table, one thin hook each.

A model under a strategy hybridpar built is trained by that strategy's
trainer (``StrategyState.trainer``, ``hybridpar.training.Trainer``), which
owns the routing of ``fit``/``evaluate``/``predict``, the step functions,
microbatching and gradient compression's state. Keras reaches it through
the hooks of ``HOOKS``: each looks up the trainer of the strategy at hand
and calls the trainer's method of the same role with Keras's own method as
first argument (the trainer calls it wherever Keras's behaviour is right);
for anything else it calls Keras's method with the same arguments, so code
that never asked for hybridpar runs Keras's path.

The fixes that replaced these methods one by one (``runner_routing``,
``microbatch_step``, ``gradient_compression``, ``padded_steps``,
``optional_outputs``, ``step_loop``, ``symbolic_build``,
``unbatched_input``) and ``end_of_data_step`` are parts of the trainer or of the step it builds;
their records name this fix in ``part_of``.

``make_train_function`` and ``make_predict_function`` also run
``model_scope``'s checks first, for every model: they act on models that are
not hybridpar's (built outside the scope and fit inside it, or stranded by a
parameter-server connection) and pass for hybridpar's own.

``check_hooks`` is the version guard of the table: every strategy hybridpar
builds first verifies that the installed Keras still has each hooked method
with the parameters the trainer passes on.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from hybridpar.compat import model_scope
from hybridpar.compat.patching import Fix, Patch, compose, guarded, register
from hybridpar.state import state_of

_TRAINER = keras_tf_trainer.TensorFlowTrainer


def _model_strategy(model: Any, *args: Any, **kwargs: Any) -> Any:
    return getattr(model, "_distribute_strategy", None)


def _iterator_strategy(iterator: Any, distribute_strategy: Any = None, *args: Any,
                       **kwargs: Any) -> Any:
    return distribute_strategy


@dataclasses.dataclass(frozen=True)
class Hook:
    """One Keras method the trainer answers for.

    Attributes:
        owner: the Keras class defining it.
        name: the method.
        parameters: the parameters the trainer relies on (checked by ``check_hooks``).
        role: the trainer's method that answers it.
        strategy: finds the strategy from the call's arguments.
        checked: ``model_scope``'s check that runs first for every model
            (the call it names: ``fit`` or ``predict``), if any.
    """

    owner: type
    name: str
    parameters: tuple[str, ...]
    role: str
    strategy: Callable[..., Any] = _model_strategy
    checked: str = ""


FIT_PARAMETERS = (
    "x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split",
    "validation_data", "shuffle", "class_weight", "sample_weight", "initial_epoch",
    "steps_per_epoch", "validation_steps", "validation_batch_size", "validation_freq",
)

HOOKS = (
    Hook(_TRAINER, "fit", FIT_PARAMETERS, "fit"),
    Hook(_TRAINER, "evaluate", ("x", "y", "batch_size", "steps", "return_dict"), "evaluate"),
    Hook(_TRAINER, "predict", ("x", "batch_size", "steps"), "predict"),
    Hook(_TRAINER, "train_step", ("data",), "train_step"),
    Hook(_TRAINER, "test_step", ("data",), "test_step"),
    Hook(_TRAINER, "make_train_function", ("force",), "make_train_function", checked="fit"),
    Hook(_TRAINER, "make_predict_function", ("force",), "make_predict_function",
         checked="predict"),
    Hook(_TRAINER, "_make_function", ("step_function",), "make_function"),
    Hook(_TRAINER, "_maybe_symbolic_build", ("iterator", "data_batch"), "symbolic_build"),
    Hook(keras_tf_trainer.TFEpochIterator, "__init__", ("distribute_strategy",),
         "epoch_iterator", strategy=_iterator_strategy),
)


def _trainer(hook: Hook, *args: Any, **kwargs: Any) -> Any:
    state = state_of(hook.strategy(*args, **kwargs))
    return None if state is None else state.trainer


def _delegating(hook: Hook) -> Callable[[Any], Any]:
    def wrap(original: Any) -> Any:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            role = getattr(_trainer(hook, *args, **kwargs), hook.role)
            return role(original, *args, **kwargs)

        return hooked

    def owns(*args: Any, **kwargs: Any) -> bool:
        return _trainer(hook, *args, **kwargs) is not None

    delegating = guarded(wrap, owns)
    if hook.checked:
        return compose(model_scope.checked_step(hook.checked), delegating)
    return delegating


@functools.cache
def check_hooks(hooks: tuple[Hook, ...] = HOOKS) -> None:
    """Verifies that Keras has every method of ``hooks`` with its parameters.

    Raises:
        RuntimeError: naming each hooked method (or parameter) the installed
            Keras lacks; the trainer would otherwise be bypassed silently.
    """
    import keras

    lacking = []
    for hook in hooks:
        method = getattr(hook.owner, hook.name, None)
        where = f"{hook.owner.__module__}.{hook.owner.__qualname__}.{hook.name}"
        if method is None:
            lacking.append(where)
            continue
        absent = [p for p in hook.parameters if p not in inspect.signature(method).parameters]
        if absent:
            lacking.append(f"{where}({', '.join(absent)})")
    if lacking:
        raise RuntimeError(
            f"Keras {keras.__version__} lacks {', '.join(lacking)}, which hybridpar's trainer "
            "hooks into (hybridpar.compat.trainer_hooks.HOOKS), so its models would train "
            "without hybridpar's steps. Install a Keras of the verified matrix "
            "(hybridpar.compat.SUPPORTED)."
        )


FIX = register(Fix(
    name="trainer_hooks",
    corrects="Keras's trainer methods have no extension point for a strategy's own steps and "
             "routing; one thin hook each hands them to hybridpar's trainer",
    group="core",
    patches=tuple(Patch(hook.owner, hook.name, _delegating(hook)) for hook in HOOKS),
))

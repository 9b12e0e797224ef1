"""A model built outside ``hybridpar.scope()`` gets an error that says so, not a graph error.

Upstream (Keras 3.15): tf_keras's ``compile`` refused a built model whose
variables were not created in the current strategy's scope ("Variable ...
was not created in the distribution strategy scope"); Keras 3 dropped the
check. A model built before a strategy's scope and compiled inside it holds
plain variables, and ``fit`` fails with a bare ``AssertionError``, as it does
for one compiled outside and fit inside the block. An optimizer created
outside keeps the strategy current at its creation (none), and one with slots
(Adam) fails in ``fit`` with "Mixing different tf.distribute.Strategy
objects". On a parameter-server chief a model built before the scope has its
variables on ``/job:localhost``, which connecting to the cluster removed
(``compat.local_job``): ``fit``, ``evaluate`` and ``predict`` fail with
"Client for target /job:localhost/replica:0/task:0 not found".

Restored for hybridpar's strategies, as ``ConfigError``s that name the model
and the order that works: ``compile`` inside a hybridpar scope and ``fit``
under a hybridpar strategy refuse variables (and an optimizer) created
outside its scope; ``fit``, ``evaluate`` and ``predict`` refuse a model whose
variables the connection stranded. Under ``mode: none`` with one stage a
plain variable is what the strategy would make, so such a model trains as it
is. ``evaluate`` and ``predict`` of a model built outside the scope only read
its variables and give the single-device figures, so they pass.

The checks of ``fit`` and ``predict`` run first in the hooks that own
``make_train_function`` and ``make_predict_function`` (``trainer_hooks``);
this fix patches ``compile`` and ``make_test_function``.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from keras.src.trainers import trainer as keras_trainer

from hybridpar.compat.local_job import LOCALHOST, connected_job, stranded
from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.errors import ConfigError
from hybridpar.state import state_of

_ORDER = ("Build and compile the model, and any layer it reuses, inside the scope: `with "
          "hybridpar.scope(config): model = build_model(); model.compile(...)`; datasets and "
          "callbacks may be made before it.")


def _value(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _distributes(strategy: tf.distribute.Strategy) -> bool:
    """True for a hybridpar strategy whose variables differ from plain ones."""
    state = state_of(strategy)
    return state is not None and (state.mode != "none" or state.stages > 1)


def _foreign(variables: list[Any], strategy: tf.distribute.Strategy) -> list[Any]:
    extended = strategy.extended
    return [v for v in variables if not extended.variable_created_in_scope(_value(v))]


def _check_created_in_scope(model: Any, strategy: tf.distribute.Strategy, call: str) -> None:
    """Raises ConfigError when ``model`` has variables ``strategy`` did not create.

    ``compile`` reads every variable, so a model assembled in the scope from
    layers built before it (a pretrained base) is caught there; ``fit``, which
    may run at every ``train_on_batch``, trusts a model constructed in the scope.
    """
    if not _distributes(strategy) or (
        call != "compile" and getattr(model, "_distribute_strategy", None) is strategy
    ):
        return
    foreign = _foreign(model.variables, strategy)
    if foreign:
        names = ", ".join(v.path for v in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ConfigError(
            f"Model {model.name!r} holds variables created outside hybridpar.scope() "
            f"({names}: plain variables on {_value(foreign[0]).device}), so it cannot train "
            f"under data_parallel.mode={state_of(strategy).mode!r} (found at model.{call}). "
            "TensorFlow distributes only variables created inside the strategy's scope (tf_keras "
            f"refused this at compile; Keras 3 does not check). {_ORDER}"
        )


def _check_optimizer(optimizer: Any, strategy: tf.distribute.Strategy) -> None:
    if not isinstance(optimizer, keras.optimizers.Optimizer) or not _distributes(strategy):
        return
    foreign = _foreign(optimizer.variables, strategy)
    if foreign:
        raise ConfigError(
            f"The optimizer {optimizer.name!r} given to model.compile was created outside "
            f"hybridpar.scope(): its variable {foreign[0].path} is not the strategy's, and "
            "Keras keeps the strategy that was current when an optimizer was created, so its "
            "updates would not run under hybridpar's (with slots, as Adam's, fit fails with "
            "'Mixing different tf.distribute.Strategy objects'). Create the optimizer inside "
            "the scope (`optimizer=keras.optimizers.Adam(...)` in the compile call there), or "
            "pass its name (`optimizer='adam'`)."
        )


def _check_reachable(model: Any, call: str) -> None:
    """Raises ConfigError for a model whose variables a cluster connection stranded."""
    owned = state_of(getattr(model, "_distribute_strategy", None)) is not None
    if owned or connected_job() in (None, LOCALHOST):
        return  # not connected, or a model built in a hybridpar scope (so after connecting)
    lost = [v for v in model.variables if stranded(getattr(_value(v), "device", "") or "")]
    if lost:
        raise ConfigError(
            f"Model {model.name!r} was built before hybridpar.scope() connected this chief to "
            f"the parameter-server cluster, so model.{call} cannot use it: its variables "
            f"({lost[0].path}, ...) live on /job:localhost, which the connection removed, so "
            f"they no longer exist. {_ORDER} Its variables then live on the parameter servers."
        )


def _checked_compile(original: Any) -> Any:
    @functools.wraps(original)
    def compile(self, *args, **kwargs):
        strategy = tf.distribute.get_strategy()
        if self.built:
            _check_created_in_scope(self, strategy, "compile")
        _check_optimizer(kwargs.get("optimizer", args[0] if args else None), strategy)
        return original(self, *args, **kwargs)

    return compile


def checked_step(call: str) -> Any:
    """Wraps ``make_<step>_function`` of ``call`` (fit, evaluate, predict) with its checks."""

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def make_function(self, force=False):
            _check_reachable(self, call)
            if call == "fit":
                _check_created_in_scope(self, self.distribute_strategy, call)
            return original(self, force=force)

        return make_function

    return wrap


FIX = register(Fix(
    name="model_scope",
    corrects="Keras 3 does not check that a model's variables belong to the strategy it "
             "trains under: a model built outside the scope fails in fit with a bare "
             "AssertionError (unknown devices on a parameter-server chief)",
    group="core",
    patches=(
        # On the class that defines it: load_model compiles a model only when
        # `type(model).compile` is `Trainer.compile` (compile_from_config).
        Patch(keras_trainer.Trainer, "compile", _checked_compile),
        Patch(keras_tf_trainer.TensorFlowTrainer, "make_test_function",
              checked_step("evaluate")),
    ),
))

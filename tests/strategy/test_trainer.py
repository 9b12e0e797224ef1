"""hybridpar.training.Trainer behind compat.trainer_hooks: the table, the routing, the guard."""

import inspect

import keras
import numpy as np
import pytest
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

import hybridpar
from hybridpar.compat import runner_routing, trainer_hooks
from hybridpar.compat.patching import known
from hybridpar.training import Trainer, fit_arguments

pytestmark = pytest.mark.strategy

X = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
Y = X.sum(axis=1, keepdims=True)
PARTS = {"runner_routing", "microbatch_step", "gradient_compression", "padded_steps",
         "optional_outputs", "step_loop", "symbolic_build", "unbatched_input",
         "end_of_data_step"}


class RecordingRunner:
    """A runner that records what the trainer hands it (the routing under test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def fit(self, model, arguments):
        self.calls.append(("fit", arguments))
        return "fit by the runner"

    def evaluate(self, model, *args, **kwargs):
        self.calls.append(("evaluate", kwargs))
        return "evaluated by the runner"

    def predict(self, model, *args, **kwargs):
        self.calls.append(("predict", kwargs))
        return "predicted by the runner"


def dense_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_every_hook_is_a_method_of_the_installed_keras_and_one_fix_owns_them_all():
    trainer_hooks.check_hooks()
    hooked = {(hook.owner, hook.name) for hook in trainer_hooks.HOOKS}
    assert len(hooked) == len(trainer_hooks.HOOKS) == 10
    owners = {(p.owner, p.name): fix.name for fix in known() for p in fix.patches}
    assert {owners[key] for key in hooked} == {"trainer_hooks"}
    for hook in trainer_hooks.HOOKS:
        assert hasattr(Trainer, hook.role), hook.role
    parts = {fix.name for fix in known() if fix.part_of == "trainer_hooks"}
    assert parts == PARTS
    assert not any(fix.patches for fix in known() if fix.name in PARTS)


def test_a_keras_without_a_hooked_method_or_parameter_is_refused():
    class OldTrainer:
        def fit(self, x=None, epochs=1):
            """A fit without most of Keras 3's parameters."""

    hooks = (trainer_hooks.Hook(OldTrainer, "fit", trainer_hooks.FIT_PARAMETERS, "fit"),
             trainer_hooks.Hook(OldTrainer, "train_step", ("data",), "train_step"))
    with pytest.raises(RuntimeError) as raised:
        trainer_hooks.check_hooks(hooks)
    message = str(raised.value)
    assert "OldTrainer.fit(y, batch_size" in message
    assert "OldTrainer.train_step" in message and "SUPPORTED" in message


def test_fit_arguments_are_bound_by_keras_signature_with_its_defaults():
    keras_fit = keras_tf_trainer.TensorFlowTrainer.fit
    arguments = fit_arguments(keras_fit, object(), X, Y, 8, epochs=3, steps_per_epoch=5)
    expected = [name for name in inspect.signature(keras_fit).parameters][1:]
    assert list(arguments) == expected
    assert arguments["batch_size"] == 8 and arguments["epochs"] == 3
    assert arguments["steps_per_epoch"] == 5 and arguments["validation_freq"] == 1
    assert arguments["x"] is X and arguments["y"] is Y
    with pytest.raises(TypeError, match="epoch"):
        fit_arguments(keras_fit, object(), X, epoch=3)


def test_a_strategys_runner_gets_fit_evaluate_and_predict_and_keras_path_gets_keras():
    with hybridpar.scope({"data_parallel": {"mode": "none"}}) as hs:
        model = dense_model()
    runner = hs.state.runner = RecordingRunner()
    try:
        assert model.fit(X, Y, epochs=2, verbose=0) == "fit by the runner"
        assert model.evaluate(X, Y, verbose=0) == "evaluated by the runner"
        assert model.predict(X, verbose=0) == "predicted by the runner"
        with runner_routing.keras_path():
            history = model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    finally:
        hs.state.runner = None
    (name, arguments), *others = runner.calls
    assert name == "fit" and arguments["epochs"] == 2 and arguments["verbose"] == 0
    assert [call for call, _ in others] == ["evaluate", "predict"]
    assert len(history.history["loss"]) == 2  # Keras's own fit, two epochs


def test_a_model_of_another_strategy_runs_keras_methods_unchanged():
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}) as hs:
        owned = dense_model()
    plain = dense_model()  # built outside any scope: Keras's default strategy
    assert trainer_hooks._trainer(trainer_hooks.HOOKS[0], plain) is None
    assert trainer_hooks._trainer(trainer_hooks.HOOKS[0], owned) is hs.state.trainer
    for model in (owned, plain):
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    # The plain model's train function is Keras's own; the owned one's the trainer's.
    assert plain.train_function.__qualname__ == "TensorFlowTrainer._make_function.<locals>.function"
    assert owned.train_function.__module__ == "hybridpar.compat.optional_outputs"

"""The trainer of one strategy hybridpar built: its models' steps, and where ``fit`` goes.

Keras's ``Trainer`` has its steps and functions as methods of the model;
hybridpar's strategies need their own step (microbatches, padded pieces of a
split batch), their own traced loop, their own input handling and, on a
parameter-server chief or the evaluator, their own ``fit``. One ``Trainer``
per strategy (``StrategyState.trainer``) holds all of it. Keras reaches it
through ``hybridpar.compat.trainer_hooks``, one thin hook per Keras method
(the table ``HOOKS``); each method here receives Keras's own method first and
calls it wherever Keras's behaviour is right, so a model under a hybridpar
strategy runs Keras's code except where this class says otherwise. The
corrections it applies are the fixes whose records name ``trainer_hooks`` in
``part_of`` (``hybridpar.compat.describe()`` lists them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from hybridpar.compat import (
    end_of_data_step,
    microbatch_step,
    optional_outputs,
    padded_steps,
    replica_share,
    runner_routing,
    symbolic_build,
    unbatched_input,
)
from hybridpar.compat.shard_views import shard_views
from hybridpar.parallel import pipeline
from hybridpar.state import Runner, StrategyState

KerasMethod = Callable[..., Any]


def fit_arguments(keras_fit: KerasMethod, model: Any, *args: Any,
                  **kwargs: Any) -> dict[str, Any]:
    """``fit``'s arguments by name, bound by Keras's own signature, defaults filled in.

    Raises:
        TypeError: for arguments Keras's ``fit`` does not take, as Keras raises it.
    """
    bound = inspect.signature(keras_fit).bind(model, *args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in list(bound.arguments.items())[1:]}


class Trainer:
    """Trains, evaluates and predicts with the models of one hybridpar strategy.

    Args:
        state: the strategy's state.
    """

    def __init__(self, state: StrategyState) -> None:
        self.state = state
        #: the running ``fit`` has a callback that saves its input's iterator
        self.fit_saves_input = False
        #: Keras's epoch iterator is distributing ``fit``'s training input now (the
        #: strategy then makes it a ``hybridpar.data.resumable.ResumableDataset``)
        self.distributing_resumable_input = False
        #: Keras's epoch iterator over the running ``fit``'s training input
        self.training_epochs: Any = None

    def _runner(self) -> Runner | None:
        """The runner that replaces Keras's loops, outside a runner's own Keras calls."""
        return None if runner_routing.on_keras_path() else self.state.runner

    def fit(self, keras_fit: KerasMethod, model: Any, *args: Any, **kwargs: Any) -> Any:
        """Keras's ``fit``, or the runner's with the arguments bound by name."""
        runner = self._runner()
        arguments = fit_arguments(keras_fit, model, *args, **kwargs)
        if runner is not None:
            return runner.fit(model, arguments)
        callbacks = getattr(arguments["callbacks"], "callbacks", arguments["callbacks"]) or []
        self.fit_saves_input = any(getattr(c, "saves_input_iterator", False) for c in callbacks)
        try:
            return keras_fit(model, *args, **kwargs)
        finally:
            self.fit_saves_input = False
            self.training_epochs = None

    def start_next_epoch_at(self, batch: int) -> bool:
        """Has the running ``fit``'s loop begin its next epoch at ``batch`` (a resume
        inside that epoch, whose input is already there): the steps before it are passed
        over without calling the train function or a callback.

        Returns:
            Whether it will (``False`` where Keras's epoch iterator is not hybridpar's
            to adjust; the loop then calls the train function for every step).
        """
        epochs = self.training_epochs
        enumerate_steps = getattr(epochs, "_enumerate_iterator", None)
        if enumerate_steps is None:
            return False

        def from_batch() -> Any:
            del epochs._enumerate_iterator  # this epoch only: Keras's method again after it
            for item in enumerate_steps():
                if item[0] >= batch:  # (first step, last step, iterator) of one execution
                    yield item

        epochs._enumerate_iterator = from_batch
        return True

    def evaluate(self, keras_evaluate: KerasMethod, model: Any, *args: Any,
                 **kwargs: Any) -> Any:
        """Keras's ``evaluate``, or the runner's."""
        runner = self._runner()
        if runner is None:
            return keras_evaluate(model, *args, **kwargs)
        return runner.evaluate(model, *args, **kwargs)

    def predict(self, keras_predict: KerasMethod, model: Any, *args: Any, **kwargs: Any) -> Any:
        """Keras's ``predict``, or the runner's."""
        runner = self._runner()
        if runner is None:
            return keras_predict(model, *args, **kwargs)
        return runner.predict(model, *args, **kwargs)

    def train_step(self, keras_train_step: KerasMethod, model: Any, data: Any) -> Any:
        """One replica's step, begun once its batch exists: microbatched or on a padded
        piece by hybridpar, else Keras's."""
        state = self.state
        keep = replica_share.current_keep()
        split = state.plan.mesh.tensor > 1
        with end_of_data_step.after_batch(data), shard_views(model) if split else nullcontext():
            if state.microbatches == 1 and keep is None:
                return keras_train_step(model, data)
            return pipeline.train_step(
                model, data, state.microbatches, sequential=state.stages == 1, keep=keep,
                schedule=state.config.model_parallel.schedule, stages=state.stages,
            )

    def test_step(self, keras_test_step: KerasMethod, model: Any, data: Any) -> Any:
        """One replica's evaluation step; padding of a split batch gets no weight."""
        keep = replica_share.current_keep()
        if keep is None:
            return keras_test_step(model, data)
        return padded_steps.padded_test_step(model, data, keep)

    def make_train_function(self, keras_make: KerasMethod, model: Any,
                            force: bool = False) -> Any:
        """Checks the complete model once and creates compression state, then Keras's."""
        if not getattr(model, "_hybridpar_checked", False):
            microbatch_step.check_before_training(model, self.state)
            model._hybridpar_checked = True
        if self.state.compression is not None:
            self.state.compression.prepare(model)
        return keras_make(model, force=force)

    def make_predict_function(self, keras_make: KerasMethod, model: Any,
                              force: bool = False) -> Any:
        """The predict function whose outputs hold exactly the input's rows (replicated)."""
        if self.state.mode == "parameter_server":
            return keras_make(model, force=force)
        if model.predict_function is None or force:
            model.predict_function = padded_steps.predict_function(model)
        return model.predict_function

    def make_function(self, keras_make_function: KerasMethod, model: Any,
                      step_function: Callable[[Any], Any]) -> Any:
        """The traced train/test function: one without Optionals under replicated strategies."""
        if self.state.mode == "parameter_server" or model.run_eagerly:
            return keras_make_function(model, step_function)
        return optional_outputs.make_function(model, step_function)

    def symbolic_build(self, keras_build: KerasMethod, model: Any, iterator: Any = None,
                       data_batch: Any = None) -> None:
        """Builds the model from the distributed dataset's spec instead of a pulled batch."""
        dataset = getattr(iterator, "_distributed_dataset", None)
        if dataset is None:
            return keras_build(model, iterator=iterator, data_batch=data_batch)
        symbolic_build.build_from_spec(model, dataset, self.state)
        return None

    def epoch_iterator(self, keras_init: KerasMethod, iterator: Any,
                       distribute_strategy: Any = None, *args: Any, **kwargs: Any) -> None:
        """Keras's epoch iterator over the input, batched and counted for this strategy;
        ``fit``'s training input is read resumably when a callback saves its iterator."""
        training = "class_weight" in kwargs  # only fit's training data passes one
        self.distributing_resumable_input = training and self.fit_saves_input
        try:
            keras_init(iterator, distribute_strategy, *args,
                       **unbatched_input.epoch_arguments(self.state, kwargs))
        finally:
            self.distributing_resumable_input = False
        if training:
            self.training_epochs = iterator

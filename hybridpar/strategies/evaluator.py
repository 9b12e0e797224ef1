"""Sidecar evaluation: ``model.fit`` on the cluster's ``evaluator`` task evaluates checkpoints.

tf_keras had ``SidecarEvaluator``; Keras 3 has nothing. With hybridpar the
same script runs on every task. On the ``evaluator`` task
``hybridpar.scope()`` builds a local strategy (one device, or mirrored over
the local devices; it joins no training collective and starts no server) and
the model is built as usual; its ``fit`` (routed here by the trainer,
``hybridpar.training``) does not train:

* it waits for the checkpoints the chief writes to ``checkpoint.dir``
  (``checkpoint.watch``), restores each new one into the model (any
  topology wrote it: values are stored whole), evaluates it on
  ``validation_data``, logs one line per checkpoint (step, epoch, metrics)
  and writes TensorBoard scalars ``evaluation_<metric>_vs_iterations`` at the
  checkpoint's step to ``evaluator.log_dir`` (default
  ``<checkpoint.dir>/evaluator``);
* a checkpoint deleted by ``checkpoint.keep`` before it was read is skipped
  with a log line, a damaged one with a warning;
* it returns a Keras ``History`` once the chief's final checkpoint has been
  evaluated: ``val_<metric>`` and ``step`` per checkpoint, and in
  ``History.epoch`` the epoch each belongs to (as the chief's History counts).

``fit``'s callbacks are the training loop's and are not run. ``evaluate``
and ``predict`` on the evaluator restore the newest checkpoint first (once
per new checkpoint).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import keras
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.checkpoint import files, model_state, storage, watch
from hybridpar.compat import runner_routing
from hybridpar.errors import ConfigError
from hybridpar.state import StrategyState

logger = logging.getLogger("hybridpar")


def _metrics_line(logs: dict[str, float]) -> str:
    return ", ".join(f"{name}={value:.4f}" for name, value in logs.items())


class EvaluatorRunner:
    """``fit``, ``evaluate`` and ``predict`` of models on the evaluator task.

    Args:
        state: the evaluator's strategy state (``checkpoint.dir`` is set:
            ``topology.plan`` checks it).
    """

    def __init__(self, state: StrategyState) -> None:
        self.state = state
        self.directory = storage.location(state.config.checkpoint.dir)
        settings = state.config.evaluator
        self.log_dir = storage.location(settings.log_dir
                                        or storage.join(self.directory, "evaluator"))
        self.watcher = watch.CheckpointWatcher(
            self.directory, poll_seconds=settings.poll_seconds,
            timeout_seconds=settings.timeout_seconds,
        )

    def fit(self, model: keras.Model, arguments: dict[str, Any]) -> keras.callbacks.History:
        """Evaluates every new checkpoint on ``validation_data`` until training ends.

        Raises:
            ConfigError: without ``validation_data``, or when ``checkpoint.dir``
                or ``evaluator.log_dir`` cannot be used (before waiting).
            CheckpointMismatchError: for a checkpoint of another model.
            TimeoutError: after ``evaluator.timeout_seconds`` without a new one.
        """
        model._assert_compile_called("fit")
        validation_data = arguments["validation_data"]
        if validation_data is None:
            raise ConfigError(
                f"model.fit on {self.state.cluster.task} (the cluster's evaluator) evaluates "
                "each checkpoint the chief writes on validation_data, but none was given. "
                "Received: validation_data=None. Pass validation_data to fit (the same script "
                "on every task: the chief validates on it too)."
            )
        watch.check_readable(self.directory)
        storage.ensure_writable(self.log_dir, key="evaluator.log_dir")
        val_x, val_y, val_weight = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
        evaluation = {"x": val_x, "y": val_y, "sample_weight": val_weight,
                      "batch_size": arguments["validation_batch_size"] or arguments["batch_size"]
                      or self.state.global_batch_size, "steps": arguments["validation_steps"]}
        if not model.built or not model.variables:
            self._keras_evaluate(model, {**evaluation, "steps": 1}, verbose=0)
        writer = tf.summary.create_file_writer(str(self.log_dir))
        history = keras.callbacks.History()
        history.set_model(model)
        history.on_train_begin()
        logger.info("hybridpar: %s evaluates the checkpoints in %s; TensorBoard summaries go "
                    "to %s", self.state.cluster.task, self.directory, self.log_dir)
        for event in self.watcher.events(arguments["epochs"]):
            if event.kind == "deleted":
                logger.info("hybridpar: %s was deleted (checkpoint.keep) before the evaluator "
                            "read it; skipped.", event.path.name)
            elif event.kind == "damaged":
                logger.warning("hybridpar: checkpoint %s is damaged: %s; the evaluator skips "
                               "it.", event.path.name, event.reason)
            else:
                logs = self._evaluate_checkpoint(model, event, evaluation, arguments["verbose"],
                                                 writer)
                history.on_epoch_end(watch.epoch_index(event.manifest),
                                     {f"val_{name}": value for name, value in logs.items()})
                history.history.setdefault("step", []).append(event.step)
        writer.close()
        return history

    def _evaluate_checkpoint(self, model: keras.Model, event: watch.Event,
                             arguments: dict[str, Any], verbose: Any,
                             writer: Any) -> dict[str, float]:
        seen = time.time() - float(event.manifest.get("created", time.time()))
        self._restore(model, event)
        logs = self._keras_evaluate(model, arguments, verbose)
        with writer.as_default():
            for name, value in logs.items():
                tf.summary.scalar(f"evaluation_{name}_vs_iterations", value, step=event.step)
        writer.flush()
        logger.info("hybridpar: evaluated %s (step %d, %s; read %.1f s after the chief saved "
                    "it): %s", event.path.name, event.step, watch.position(event.manifest), seen,
                    _metrics_line(logs))
        return logs

    def _keras_evaluate(self, model: keras.Model, arguments: dict[str, Any],
                        verbose: Any) -> dict[str, float]:
        with runner_routing.keras_path():
            logs = model.evaluate(**arguments, verbose=verbose, return_dict=True)
        return {name: float(value) for name, value in logs.items()}

    def _restore(self, model: keras.Model, event: watch.Event) -> None:
        model_state.apply_weights(model, event.path, event.manifest, event.arrays)
        model._hybridpar_checkpoint_step = event.step

    def _newest_into(self, model: keras.Model) -> None:
        """Restores the newest checkpoint, unless the model holds it already."""
        watch.check_readable(self.directory)
        if not model.variables:
            raise ConfigError(
                f"Model {model.name!r} has no variables yet, so the evaluator cannot restore a "
                "checkpoint into it. Build it first (give it an Input, or call fit on the "
                "evaluator, which builds it from validation_data)."
            )
        names = files.list_checkpoints(self.directory)
        held = getattr(model, "_hybridpar_checkpoint_step", None)
        if names and files.step_of(names[-1]) == held:
            return
        event = self.watcher.newest()
        if event.step != held:
            self._restore(model, event)
            logger.info("hybridpar: the evaluator restored %s (step %d, %s)", event.path.name,
                        event.step, watch.position(event.manifest))

    def evaluate(self, model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate`` on the newest checkpoint."""
        self._newest_into(model)
        with runner_routing.keras_path():
            return model.evaluate(*args, **kwargs)

    def predict(self, model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        """``model.predict`` with the newest checkpoint's weights."""
        self._newest_into(model)
        with runner_routing.keras_path():
            return model.predict(*args, **kwargs)

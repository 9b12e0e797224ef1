"""Parameter-server training with the unmodified Keras 3 ``model.fit``.

Keras 3 has no parameter-server path (keras-team/keras#18624): under
``tf.distribute.experimental.ParameterServerStrategy`` nothing schedules work
on the workers. hybridpar's path, learnt from tf_keras's
``_ClusterCoordinatorDataHandler``:

* every task runs the same script; ``worker`` and ``ps`` tasks start their
  ``tf.distribute.Server`` in ``hybridpar.scope()`` and block there
  (``parameter_server.serve``); only the chief (the coordinator) returns;
* on the chief, ``model.fit`` (routed here by the trainer, ``hybridpar.training``) turns the
  user's dataset into per-worker datasets, schedules ``steps_per_epoch``
  training steps per epoch with ``ClusterCoordinator.schedule`` (asynchronous
  updates on the parameter servers), joins at each epoch's end, then reports
  the metrics, validates and calls the Keras callbacks on the chief;
* ``evaluate``/``predict`` (and validation) run on the chief, reading the
  variables from the parameter servers; a dataset created before
  ``hybridpar.scope()`` connected the chief is moved to the chief's device
  first (``chief_datasets``), so the order of TensorFlow's tutorials (data
  first) works;
* variables split by ``parameter_server.partitioner`` are
  ``ShardedVariable``s; gradients are taken against their shards and the
  optimizer keeps one slot per shard, on that shard's ps
  (``compat.shard_views``); an ``Embedding`` gathers only the rows it
  looks up, shard by shard.

With ``hs.callbacks()``, SIGTERM on the chief stops the scheduling before the
next step, joins the steps in flight, saves and exits (``checkpoint.preemption``);
a relaunch resumes inside that epoch, skipping the steps its checkpoint says
are done (``model._hybridpar_initial_batch``, set by ``PeriodicCheckpoint``).

If a worker dies, the coordinator re-runs its unfinished steps on the others
(at least once: a step that updated the ps just before the worker died runs
again) and takes the worker back when it returns; if a parameter server dies, ``fit`` raises
``hybridpar.ParameterServerUnavailableError`` naming it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.callbacks import callback_list as keras_callback_list
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.compat import runner_routing
from hybridpar.compat.atomic_updates import atomic_updates
from hybridpar.compat.shard_views import shard_views
from hybridpar.data import inspect
from hybridpar.errors import ConfigError, ParameterServerUnavailableError
from hybridpar.strategies import chief_datasets, ps_chief
from hybridpar.topology.cluster import ClusterInfo
from hybridpar.topology.ps_cluster import PS_TASK, ps_tasks_in, root_cause

logger = logging.getLogger("hybridpar")

_FIT_EXAMPLE = "model.fit(dataset_fn, epochs=3, steps_per_epoch=100)"


def check_training_input(x: Any, y: Any, steps_per_epoch: Any, unsupported: dict) -> None:
    """Rejects ``fit`` arguments parameter-server training cannot use.

    Raises:
        ConfigError: for a missing ``steps_per_epoch``, an input that is not a
            dataset or a dataset function, a dataset built from Python code,
            or ``y``/``validation_split``/weights given separately.
    """
    if steps_per_epoch is None or isinstance(steps_per_epoch, bool) or (
        not isinstance(steps_per_epoch, int) or steps_per_epoch < 1
    ):
        raise ConfigError(
            "model.fit under data_parallel.mode='parameter_server' needs steps_per_epoch (a "
            "positive int): workers read their datasets endlessly and asynchronously, so an "
            f"epoch is a number of steps. Received: steps_per_epoch={steps_per_epoch!r}. "
            f"Pass e.g. {_FIT_EXAMPLE}."
        )
    given = {name: value for name, value in unsupported.items() if value}
    if y is not None or given:
        names = ", ".join(["y" if y is not None else "", *given]).strip(", ")
        raise ConfigError(
            f"model.fit under data_parallel.mode='parameter_server' takes its data from one "
            f"dataset; Received: {names}. Put labels (and sample weights) into the dataset's "
            "elements as (x, y[, weight]) and pass validation data as validation_data."
        )
    if isinstance(x, tf.data.Dataset):
        python_ops = inspect.python_ops(x)
        if python_ops:
            raise ConfigError(
                "model.fit under data_parallel.mode='parameter_server' cannot send this "
                f"tf.data.Dataset to the workers: it runs Python code ({', '.join(python_ops)}, "
                "e.g. Dataset.from_generator or tf.py_function), which exists on the chief "
                "only. Pass a function that builds the dataset on each worker instead: "
                "`def dataset_fn(input_context): ...; return dataset` and "
                f"{_FIT_EXAMPLE}, using only tf.data/TensorFlow ops."
            )
        return
    if isinstance(x, tf.data.Iterator) or not callable(x):
        raise ConfigError(
            "model.fit under data_parallel.mode='parameter_server' needs a tf.data.Dataset "
            "or a function `dataset_fn(input_context) -> tf.data.Dataset` that each worker "
            f"calls to build its own dataset. Received: {type(x).__name__}. Build the "
            "dataset inside a function (e.g. from_tensor_slices on arrays, or file reading, "
            f"sharded with input_context.input_pipeline_id) and pass it: {_FIT_EXAMPLE}."
        )


def _batched(dataset: tf.data.Dataset, batch_size: int | None) -> tf.data.Dataset:
    if inspect.is_batched(dataset):
        return dataset
    if batch_size is None:
        raise ConfigError(
            "The dataset given to model.fit yields single examples and neither batch_size "
            "nor data.global_batch_size is set, so hybridpar cannot batch it. Set "
            "data.global_batch_size (examples per training step), or batch the dataset."
        )
    return dataset.batch(batch_size)


def per_worker_input(
    x: tf.data.Dataset | Callable[[tf.distribute.InputContext], tf.data.Dataset],
    num_workers: int,
    batch_size: int | None,
) -> tf.data.Dataset | Callable[[], tf.data.Dataset]:
    """What ``ClusterCoordinator.create_per_worker_dataset`` builds on each worker.

    A dataset is batched if it yields single examples, repeated, and sent to
    every worker whole. A dataset function is called on each worker with an
    ``InputContext`` whose ``num_input_pipelines`` is the number of workers
    and ``input_pipeline_id`` that worker's index (a tensor), so it can shard;
    it must return batches. Either way the pipeline repeats, since an epoch
    is ``steps_per_epoch`` steps.
    """
    if isinstance(x, tf.data.Dataset):
        return _batched(x, batch_size).repeat()

    def dataset_fn() -> tf.data.Dataset:
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        context = tf.distribute.InputContext(
            num_input_pipelines=num_workers, input_pipeline_id=index
        )
        dataset = x(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise ConfigError(
                "The dataset function given to model.fit must return a tf.data.Dataset. "
                f"Received: {type(dataset).__name__} from {getattr(x, '__name__', x)!r}."
            )
        return dataset.repeat()

    return dataset_fn


def _prepare(model: keras.Model, element_spec: Any) -> None:
    """Builds the model, its metrics and the optimizer (one slot set per shard)."""
    with model.distribute_strategy.scope(), shard_views(model):
        if model.optimizer is not None and not model.optimizer.built and model.built:
            model.optimizer.build(model.trainable_variables)
        model._symbolic_build(data_batch=element_spec)


def _train_function(model: keras.Model) -> Callable:
    strategy = model.distribute_strategy

    def step(data):
        with shard_views(model), atomic_updates():
            return model.train_step(data)

    @tf.function
    def train_function(iterator):
        strategy.run(step, args=(next(iterator),))

    return train_function


def _ps_unavailable(error: BaseException, cluster: ClusterInfo) -> ParameterServerUnavailableError:
    tasks = ps_tasks_in(str(error), cluster) or [f"one of ps:0..{cluster.num_ps - 1}"]
    cause = root_cause(str(error)) or type(error).__name__
    return ParameterServerUnavailableError(
        f"Parameter server {', '.join(tasks)} became unavailable during training, so its "
        f"variables are lost ({type(error).__name__}: {cause[:300]}). Training cannot "
        "continue without it. Restart the cluster (hybridpar launch --max-restarts N does); "
        "with checkpoint.dir set, hs.callbacks() resume from the last checkpoint."
    )


def _is_ps_failure(error: BaseException) -> bool:
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    return cluster_coordinator._is_ps_failure(error) or bool(PS_TASK.search(str(error)))


@contextlib.contextmanager
def _naming_lost_ps(cluster: ClusterInfo) -> Iterator[None]:
    """Turns TensorFlow's errors for a lost ps into one that names the ps task."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError) as err:
        if _is_ps_failure(err):
            raise _ps_unavailable(err, cluster) from err
        raise


def _validation_input(validation_data: Any) -> tuple[Any, Any, Any] | None:
    """``(x, y, sample_weight)`` of ``validation_data`` (arrays or a dataset, as in Keras),
    with a dataset where the chief can iterate it."""
    if validation_data is None:
        return None
    x, y, weight = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
    return chief_datasets.dataset_on_chief(x, "The validation dataset (validation_data)"), y, weight


def _on_chief(args: tuple, kwargs: dict, call: str) -> tuple[tuple, dict]:
    """The ``x`` of an ``evaluate``/``predict`` call, where the chief can iterate it."""
    role = f"The dataset given to model.{call}"
    if args:
        return (chief_datasets.dataset_on_chief(args[0], role), *args[1:]), kwargs
    if "x" in kwargs:
        return args, {**kwargs, "x": chief_datasets.dataset_on_chief(kwargs["x"], role)}
    return args, kwargs


def _callback_list(model, callbacks, verbose, epochs, steps) -> keras.callbacks.CallbackList:
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    return keras_callback_list.CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0, verbose=verbose,
        epochs=epochs, steps=steps, model=model,
    )


class ParameterServerRunner:
    """``fit``, ``evaluate`` and ``predict`` of models under one parameter-server strategy.

    Args:
        strategy: hybridpar's parameter-server strategy (on the chief).
        cluster: its cluster.
    """

    def __init__(self, strategy: tf.distribute.Strategy, cluster: ClusterInfo) -> None:
        self.cluster = cluster
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    def fit(self, model: keras.Model, arguments: dict[str, Any]) -> keras.callbacks.History:
        """``model.fit`` on the chief of a parameter-server cluster (see the module doc).

        Args:
            model: the model.
            arguments: every parameter of Keras's ``fit`` by name.
        """
        model._assert_compile_called("fit")
        steps_per_epoch, epochs = arguments["steps_per_epoch"], arguments["epochs"]
        check_training_input(arguments["x"], arguments["y"], steps_per_epoch, {
            name: arguments[name] for name in ("validation_split", "class_weight",
                                               "sample_weight")})
        validation = _validation_input(arguments["validation_data"])
        state = model.distribute_strategy.hybridpar_state
        batch_size = arguments["batch_size"] or state.global_batch_size
        per_worker = self.coordinator.create_per_worker_dataset(
            per_worker_input(arguments["x"], len(self.cluster.jobs["worker"]), batch_size)
        )
        _prepare(model, per_worker.element_spec)
        iterator, train_function = iter(per_worker), _train_function(model)
        callbacks = _callback_list(model, arguments["callbacks"], arguments["verbose"], epochs,
                                   steps_per_epoch)
        model.stop_training = False
        callbacks.on_train_begin()
        # Steps of the first epoch a checkpoint says are done (PeriodicCheckpoint sets it).
        first_step = getattr(model, "_hybridpar_initial_batch", 0) or 0
        logs: dict[str, Any] = {}
        with _naming_lost_ps(self.cluster):
            for epoch in range(model._initial_epoch or arguments["initial_epoch"], epochs):
                model.reset_metrics()
                callbacks.on_epoch_begin(epoch)
                self._train_epoch(model, callbacks, train_function, iterator,
                                  range(first_step, steps_per_epoch))
                first_step = 0
                logs = {name: float(value) for name, value in model.get_metrics_result().items()}
                if validation is not None and model._should_eval(epoch,
                                                                 arguments["validation_freq"]):
                    logs.update(self._validate(model, validation, arguments, batch_size))
                callbacks.on_epoch_end(epoch, logs)
                if model.stop_training:
                    break
        callbacks.on_train_end(logs=logs)
        return model.history

    def _validate(self, model: keras.Model, validation: tuple[Any, Any, Any],
                  arguments: dict[str, Any], batch_size: int | None) -> dict[str, float]:
        """The ``val_`` logs of one epoch, evaluated on the chief."""
        val_x, val_y, val_weight = validation
        val_logs = self.evaluate(
            model, val_x, val_y, sample_weight=val_weight,
            batch_size=arguments["validation_batch_size"] or batch_size,
            steps=arguments["validation_steps"], verbose=0, return_dict=True,
        )
        return {f"val_{name}": value for name, value in val_logs.items()}

    def _train_epoch(self, model: keras.Model, callbacks: keras.callbacks.CallbackList,
                     train_function: Callable, iterator: Any, steps: range) -> None:
        """Schedules one epoch's steps; its last batch ends when all of them are done."""
        for step in steps:
            callbacks.on_train_batch_begin(step)
            self.coordinator.schedule(train_function, args=(iterator,))
            last = step == steps.stop - 1 or model.stop_training
            if last:
                self.coordinator.join()
            callbacks.on_train_batch_end(step, {})
            if last:
                break

    def evaluate(self, model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate`` on the chief, reading the variables from the ps tasks."""
        args, kwargs = _on_chief(args, kwargs, "evaluate")
        with ps_chief.on_chief(model.distribute_strategy), runner_routing.keras_path():
            return model.evaluate(*args, **kwargs)

    def predict(self, model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        """``model.predict`` on the chief, reading the variables from the ps tasks."""
        args, kwargs = _on_chief(args, kwargs, "predict")
        with ps_chief.on_chief(model.distribute_strategy), runner_routing.keras_path():
            return model.predict(*args, **kwargs)

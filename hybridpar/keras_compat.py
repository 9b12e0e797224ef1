"""Every workaround for Keras or TensorFlow internals, in one place.

Each fix names the upstream behaviour it corrects, is guarded by the versions
it was verified against, and has a test in ``tests/strategy/test_keras_compat.py``
that reproduces the upstream behaviour without hybridpar, so we learn when
upstream changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow import optimizer as keras_tf_optimizer
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from keras.src.losses import loss as keras_loss
from keras.src.trainers.data_adapters import data_adapter_utils
from tensorflow.python import pywrap_tfe
from tensorflow.python.data.experimental.ops import distribute as distribute_ops
from tensorflow.python.distribute import (
    collective_all_reduce_strategy,
    collective_util,
    cross_device_utils,
    numpy_dataset,
    sharded_variable,
)
from tensorflow.python.distribute import (
    cross_device_ops as cross_device_ops_lib,
)
from tensorflow.python.eager import backprop
from tensorflow.python.framework import ops

from hybridpar import batching, pipeline, placement, staging
from hybridpar.errors import ConfigError

logger = logging.getLogger("hybridpar")

VERIFIED_TF = ("2.21",)
VERIFIED_KERAS = ("3.15",)

_KEY_BASE_STRIDE = 100_000
_key_bases = itertools.count(1)


def check_versions() -> None:
    """Refuses to run on TensorFlow/Keras lines whose internals were not verified.

    Raises:
        RuntimeError: naming the installed and the verified versions.
    """
    tf_line = ".".join(tf.__version__.split(".")[:2])
    keras_line = ".".join(keras.__version__.split(".")[:2])
    if tf_line not in VERIFIED_TF or keras_line not in VERIFIED_KERAS:
        raise RuntimeError(
            f"hybridpar relies on TensorFlow/Keras internals verified on TensorFlow "
            f"{', '.join(VERIFIED_TF)} and Keras {', '.join(VERIFIED_KERAS)}; installed: "
            f"TensorFlow {tf.__version__}, Keras {keras.__version__}. Install the verified "
            "versions (pip install -e . pins them)."
        )


def mirrored_strategy(
    devices: tuple[str, ...], ring: bool = False
) -> tf.distribute.MirroredStrategy:
    """A ``tf.distribute.MirroredStrategy`` whose collective keys are its own.

    Upstream: every MirroredStrategy starts its collective group keys at
    ``1 + MirroredStrategy._collective_key_base`` (a class attribute, 0), so a
    second instance over other devices in the same process reuses group key 1
    and the runtime aborts with "is joining a group that is already full
    (group_key=1)". TensorFlow's own tests set the attribute per instance; so
    do we, before ``__init__`` reads it, keeping the public type unchanged.

    Args:
        devices: the replica devices.
        ring: force RING collectives (TensorFlow's default is NCCL on GPUs
            and RING on CPUs).
    """
    check_versions()
    key_base = next(_key_bases) * _KEY_BASE_STRIDE
    cross_device_ops = None
    if ring:
        cross_device_ops = cross_device_ops_lib.CollectiveAllReduce(
            devices=list(devices),
            group_size=len(devices),
            options=collective_util.Options(
                implementation=collective_util.CommunicationImplementation.RING
            ),
            collective_keys=cross_device_utils.CollectiveKeys(group_key_start=1 + key_base),
        )
    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = key_base
    strategy.__init__(devices=list(devices), cross_device_ops=cross_device_ops)
    distribute_batches_evenly(strategy)
    return strategy


def multi_worker_strategy(
    options: tf.distribute.experimental.CommunicationOptions, *, server_running: bool
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """A ``MultiWorkerMirroredStrategy`` with its own collective key base.

    Two upstream behaviours are corrected. The collective key base is the
    same class attribute as in ``mirrored_strategy``: the strategy built at
    cluster bring-up and the one built by ``scope()`` would otherwise share
    group keys. And every new instance re-enables collective ops on the
    running context (``CollectiveAllReduceExtended._initialize_multi_worker``
    checks ``_std_server_started`` on the new instance only): that resets the
    collective executor while a peer may already be sending to it, and the
    first variable broadcast then hangs now and again. When this process's
    server is already running, the new instance is marked as started, so it
    only builds its collectives (its health checks stay with the coordination
    service, as for the first instance).
    """
    check_versions()
    strategy_class = tf.distribute.MultiWorkerMirroredStrategy
    strategy = strategy_class.__new__(strategy_class)
    strategy._collective_key_base = next(_key_bases) * _KEY_BASE_STRIDE
    extended_class = collective_all_reduce_strategy.CollectiveAllReduceExtended
    if not server_running:
        strategy.__init__(communication_options=options)
        return strategy
    with _class_attributes(extended_class, _std_server_started=True, _enable_check_health=False):
        strategy.__init__(communication_options=options)
    return strategy


@contextlib.contextmanager
def _class_attributes(owner: type, **values: Any) -> Iterator[None]:
    """Sets class attributes for the duration of the block."""
    saved = {name: owner.__dict__[name] for name in values if name in owner.__dict__}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name in values:
            if name in saved:
                setattr(owner, name, saved[name])
            else:
                delattr(owner, name)


def distribute_batches_evenly(strategy: tf.distribute.Strategy) -> None:
    """Makes ``strategy.experimental_distribute_dataset`` split batches evenly.

    Upstream (TF 2.21, ``input_lib._make_rebatch_fn``): when TensorFlow can
    read a batch size from the dataset graph (file-based pipelines), it
    rebatches front-first, so a final partial batch of 92 examples over 4
    replicas becomes 32, 32, 28 and 0. An empty replica is harmful: oneDNN's
    fused Conv2D returns a wrongly shaped tensor for an empty batch ("input
    depth must be evenly divisible by filter depth: 1 vs 32") and batch
    statistics of zero examples are NaN. Here every global batch is split
    evenly (23, 23, 23, 23) with TensorFlow's own even-split rebatch op, the
    one it uses when it cannot read a batch size. Datasets whose batches
    have one static size that divides over the replicas (``drop_remainder``)
    are already even and pass unchanged, keeping their static shapes. Only a
    final batch with fewer examples than replicas still leaves replicas
    empty; no example is dropped. Keras's ``model.fit`` calls this method on
    the strategy, so replacing it on hybridpar's own instances covers every
    fit/evaluate/predict without touching Keras.
    """
    fallback = strategy.experimental_distribute_dataset

    @functools.wraps(fallback)
    def experimental_distribute_dataset(dataset, options=None):
        replicas = strategy.num_replicas_in_sync
        if replicas == 1 or not isinstance(dataset, tf.data.Dataset):
            return fallback(dataset, options)
        size = batching.static_batch_size(dataset)
        if not batching.is_batched(dataset) or (size is not None and size % replicas == 0):
            return fallback(dataset, options)
        per_replica = distribute_ops._LegacyRebatchDataset(dataset, replicas)
        return strategy.distribute_datasets_from_function(lambda _: per_replica, options)

    strategy.experimental_distribute_dataset = experimental_distribute_dataset


def _per_replica_spec(spec: Any) -> Any:
    """The spec one replica sees, from a (possibly PerReplica) element spec."""
    value_specs = getattr(spec, "_value_specs", None)
    return value_specs[0] if value_specs else spec


def _symbolic_build_from_specs(original):
    """Wraps ``TensorFlowTrainer._maybe_symbolic_build`` to read shapes, not data.

    Upstream (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py``): under
    any non-default strategy, every ``fit``/``evaluate``/``predict`` pulls a
    real batch from a fresh iterator just to learn input shapes, and
    ``strategy.reduce("MEAN", batch)`` s it. That (a) consumes one pass of a
    reshuffling dataset, so distributed training sees another data order than
    single-device training with the same seed, (b) costs an extra iterator
    (prefetch fill) per call, and (c) raises under
    MultiWorkerMirroredStrategy, where reducing a nested PerReplica batch
    fails (keras-team/keras#20585). ``_symbolic_build`` only needs shapes and
    dtypes, which the distributed dataset's ``element_spec`` already has.
    """

    @functools.wraps(original)
    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        dataset = getattr(iterator, "_distributed_dataset", None)
        if self._distribute_strategy is None or dataset is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        specs = tf.nest.map_structure(
            _per_replica_spec,
            dataset.element_spec,
            expand_composites=False,
        )
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=specs)

    maybe_symbolic_build.__hybridpar_fix__ = True
    return maybe_symbolic_build


_global_batch_sizes: weakref.WeakKeyDictionary[tf.distribute.Strategy, int | None] = (
    weakref.WeakKeyDictionary()
)


def register_global_batch_size(strategy: tf.distribute.Strategy, size: int | None) -> None:
    """Tells the input fix below which global batch a hybridpar strategy uses."""
    _global_batch_sizes[strategy] = size


def _batch_unbatched_datasets(original):
    """Wraps ``TFEpochIterator.__init__`` to batch unbatched datasets.

    Keras counts the steps of an epoch from the dataset it is given, before
    the strategy sees it, so a dataset of single examples has to be batched
    here, where ``fit``/``evaluate``/``predict`` (and validation data) enter,
    for the progress bar to count the real steps. Only datasets handed to a
    strategy built by hybridpar are touched; batched ones pass unchanged.
    """

    @functools.wraps(original)
    def __init__(self, distribute_strategy=None, *args, **kwargs):
        x = kwargs.get("x")
        if (
            distribute_strategy in _global_batch_sizes
            and isinstance(x, tf.data.Dataset)
            and not batching.is_batched(x)
        ):
            size = _global_batch_sizes[distribute_strategy]
            if size is None:
                raise ConfigError(
                    "The dataset given to Keras yields single examples and "
                    "data.global_batch_size is null, so hybridpar cannot batch it. Set "
                    "data.global_batch_size, or batch the dataset yourself."
                )
            kwargs["x"] = x.batch(size)
        original(self, distribute_strategy, *args, **kwargs)

    __init__.__hybridpar_fix__ = True
    return __init__


_private_output: weakref.WeakKeyDictionary[tf.distribute.Strategy, Any] = (
    weakref.WeakKeyDictionary()
)


def register_private_output(strategy: tf.distribute.Strategy, output_dir: Any) -> None:
    """Marks ``strategy`` as a non-chief worker's; ``output_dir(path)`` gives its private dir."""
    _private_output[strategy] = output_dir


def _redirect_files(callback: keras.callbacks.Callback, output_dir: Any) -> None:
    """Points a Keras callback's writes at this (non-chief) worker's private dir."""
    if getattr(callback, "_hybridpar_redirected", False):
        return
    callback._hybridpar_redirected = True
    if isinstance(callback, keras.callbacks.TensorBoard):
        callback.log_dir = str(output_dir(callback.log_dir))
    elif isinstance(callback, keras.callbacks.ModelCheckpoint):
        path = os.path.abspath(callback.filepath)
        callback.filepath = str(output_dir(os.path.dirname(path)) / os.path.basename(path))
    elif isinstance(callback, keras.callbacks.CSVLogger):
        path = os.path.abspath(callback.filename)
        callback.filename = str(output_dir(os.path.dirname(path)) / os.path.basename(path))
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        callback._save_model = lambda: None
        callback.delete_checkpoint = False


def _chief_only_files(original):
    """Wraps ``CallbackList.set_model`` so only the chief writes callback files.

    Upstream (Keras 3.15): callbacks know nothing of chiefs. Under
    MultiWorkerMirroredStrategy every worker writes TensorBoard logs,
    checkpoints and CSV logs to the same paths, and ``BackupAndRestore``
    crashes a worker with ``FileExistsError`` on the shared backup dir. On a
    non-chief worker of a hybridpar strategy, TensorBoard, ModelCheckpoint
    and CSVLogger write to the worker's private temporary dir instead, and
    BackupAndRestore only restores (from the chief's files) and never writes
    or deletes.
    """

    @functools.wraps(original)
    def set_model(self, model):
        strategy = getattr(model, "_distribute_strategy", None)
        output_dir = _private_output.get(strategy) if strategy is not None else None
        if output_dir is not None:
            for callback in self.callbacks:
                _redirect_files(callback, output_dir)
        original(self, model)

    set_model.__hybridpar_fix__ = True
    return set_model


_replica_share: contextvars.ContextVar[tuple[tf.Tensor, tf.Tensor] | None] = (
    contextvars.ContextVar("hybridpar_replica_share", default=None)
)


_example_count: contextvars.ContextVar[tuple[tf.Tensor, float] | None] = contextvars.ContextVar(
    "hybridpar_example_count", default=None
)


def _train_step(original, model: keras.Model, data: Any) -> Any:
    """Keras's train step, or hybridpar's microbatched one when the config asks."""
    placer = staging.placer_for(model.distribute_strategy)
    if placer is None or placer.microbatches == 1:
        return original(model, data)
    return pipeline.train_step(
        model, data, placer.microbatches, sequential=placer.mesh.stages == 1
    )


def _train_step_with_replica_share(original):
    """Wraps ``TensorFlowTrainer.train_step`` to weight replicas by their examples.

    Upstream (Keras 3.15, ``keras/src/losses/loss.py``): a replica's mean loss
    is scaled by ``1 / num_replicas``, which is right only when every replica
    holds the same number of examples; on a final partial batch the step's
    gradient is misweighted and distributed training drifts from the
    single-device result. Here each replica's loss is scaled by its share of
    the examples, ``local / total``; the loss tracker is unscaled by the same
    share so progress bars stay exact. Skipped when the batch size is static
    (every replica then holds the same number).

    When the strategy's global batch ``B`` is known (``data.global_batch_size``)
    the loss is scaled by ``local / B`` and the true total rides along in the
    gradient all-reduce Keras already does (see
    ``_gradients_rescaled_by_example_count``), so no extra collective runs;
    otherwise ``total`` is one scalar all-reduce.
    """

    @functools.wraps(original)
    def train_step(self, data):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return _train_step(original, self, data)
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(data)
        first = next(t for t in tree.flatten(x) if t is not None)
        if first.shape[0] is not None:
            return _train_step(original, self, data)
        local = tf.cast(tf.shape(first)[0], tf.float32)
        strategy = self.distribute_strategy
        nominal = _global_batch_sizes.get(strategy) if strategy in _global_batch_sizes else None
        if nominal is None:
            share_token = _replica_share.set((local, context.all_reduce("SUM", local)))
            count_token = None
        else:
            share_token = _replica_share.set((local, tf.constant(float(nominal))))
            count_token = _example_count.set((local, float(nominal)))
        try:
            return _train_step(original, self, data)
        finally:
            _replica_share.reset(share_token)
            if count_token is not None:
                _example_count.reset(count_token)

    train_step.__hybridpar_fix__ = True
    return train_step


def _rescaled(gradient: Any, factor: tf.Tensor) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values * tf.cast(factor, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)


def _local_devices(variable: Any) -> frozenset[str]:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return frozenset(
        f"/device:{spec.device_type}:{spec.device_index}"
        for spec in (tf.DeviceSpec.from_string(part.device)
                     for part in getattr(value, "values", [value]))
    )


def _all_reduce_by_stage(original, optimizer: Any, grads_and_vars: Any) -> list:
    """All-reduces gradients in one batch per stage (part of fix 3's wrapper).

    Upstream (TF 2.21, ``cross_device_ops``): one batch all-reduce of values
    that live on different devices falls back to reducing them one by one,
    with a warning ("Efficient batch_reduce is not supported if destinations
    are different") on every trace. With model-parallel stages, each stage's
    gradients live on that stage's devices, so they are reduced as one batch
    per stage. A ``None`` variable (fix 3's example count) goes with stage 0.
    """
    pairs = list(grads_and_vars)
    placer = staging.placer_for()
    if placer is None or placer.mesh.stages == 1:
        return original(optimizer, pairs)
    stage_0 = frozenset(placer.mesh.stage_devices(0))
    groups: dict[frozenset[str], list[int]] = {}
    for index, (_, variable) in enumerate(pairs):
        key = stage_0 if variable is None else _local_devices(variable)
        groups.setdefault(key, []).append(index)
    reduced: list[Any] = [None] * len(pairs)
    for indices in groups.values():
        group = original(optimizer, [pairs[i] for i in indices])
        for index, pair in zip(indices, group, strict=True):
            reduced[index] = pair
    return reduced


def _gradients_rescaled_by_example_count(original):
    """Wraps ``TFOptimizer._all_reduce_sum_gradients`` for the share fix above.

    Gradients were taken of losses scaled by ``local / B``; the replicas'
    example counts are summed in the same all-reduce as the gradients, and
    the sums are rescaled by ``B / total``, which makes every replica's weight
    ``local / total``. On full batches ``total == B`` and the factor is 1.
    """

    @functools.wraps(original)
    def all_reduce_sum_gradients(self, grads_and_vars):
        count = _example_count.get()
        if count is None or not tf.distribute.get_replica_context():
            return _all_reduce_by_stage(original, self, grads_and_vars)
        local, nominal = count
        reduced = list(_all_reduce_by_stage(original, self, [*grads_and_vars, (local, None)]))
        total = reduced.pop()[0]
        factor = tf.math.divide_no_nan(tf.constant(nominal, tf.float32), total)
        return [(_rescaled(gradient, factor), variable) for gradient, variable in reduced]

    all_reduce_sum_gradients.__hybridpar_fix__ = True
    return all_reduce_sum_gradients


def _scaled_by_share(original, invert: bool):
    """Wraps Keras's (un)scale_loss_for_distribution to use the replica share."""

    @functools.wraps(original)
    def scale(value):
        share = _replica_share.get()
        if share is None:
            return original(value)
        local, total = share
        factor = tf.math.divide_no_nan(total, local) if invert else local / total
        return value * tf.cast(factor, value.dtype)

    scale.__hybridpar_fix__ = True
    return scale


def _mean_over_replicas_for_multi_worker(original):
    """Wraps Keras's ``reduce_per_replica`` so MWMS metric means work.

    Upstream (Keras 3.15, ``keras/src/backend/tensorflow/trainer.py``): under
    MultiWorkerMirroredStrategy ``reduction="mean"``/``"auto"`` calls
    ``strategy.reduce("MEAN", v, axis=0)`` on each logged value; logs are
    scalars, so every ``fit`` fails with "Invalid reduction dimension 0 for
    input with 0 dimensions" (tensorflow/tensorflow#72388). The mean over
    replicas, which is what the single-worker path computes
    (``reduce_mean(local_results, axis=0)``), is ``axis=None``.
    """

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and keras_tf_trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica.__hybridpar_fix__ = True
    return reduce_per_replica


class _OnDevices:
    """A ``colocate_with`` target: MirroredStrategy mirrors a variable over its ``_devices``."""

    def __init__(self, devices: tuple[str, ...]) -> None:
        self._devices = devices


def place_variables_by_stage(strategy: tf.distribute.Strategy, placer: Any) -> None:
    """Makes ``strategy`` create each variable on its layer's stage devices.

    Upstream (TF 2.21, ``mirrored_strategy.MirroredExtended._create_variable``):
    every variable created in a strategy's scope is mirrored over all replica
    devices, and Keras ignores a ``tf.device`` block around construction (see
    fix 9), so nothing puts a layer's weights on another device. The strategy
    honours a ``colocate_with`` argument, though: an object with ``_devices``
    mirrors over exactly those devices, a ``numpy_dataset.SingleDevice`` makes
    a plain variable there (DESIGN.md fact 5). Replacing ``_create_variable``
    on hybridpar's own strategy instance passes the stage's devices for
    variables built inside a placed layer; slots, which Keras creates with a
    ``colocate_with`` of their variable, are left alone.
    """
    extended = strategy.extended
    create_variable = extended._create_variable

    def create_placed_variable(next_creator: Any, **kwargs: Any) -> Any:
        if kwargs.get("colocate_with") is None:
            stage = placer.stage_of(staging.layer_path())
            if stage:
                devices = placer.mesh.stage_devices(stage)
                kwargs["colocate_with"] = (
                    _OnDevices(devices) if placer.mirrored
                    else numpy_dataset.SingleDevice(devices[0])
                )
        return create_variable(next_creator, **kwargs)

    extended._create_variable = create_placed_variable
    staging.register(strategy, placer)


def _record_stage(original):
    """Wraps ``keras.Layer.__new__`` to remember ``hybridpar.stage(k)``.

    Upstream (Keras 3.15): a ``tf.device`` block around layer construction is
    ignored, because variables are created later, when the layer is built
    (DESIGN.md fact 4). The stage is therefore recorded on the layer object
    when it is constructed and applied when it is built and called.
    ``__new__`` is wrapped rather than ``__init__`` because Keras reads each
    layer class's ``__init__`` signature to serialise it.
    """

    @functools.wraps(original)
    def __new__(cls, *args, **kwargs):
        layer = original(cls, *args, **kwargs)
        placement.record_layer(layer)
        return layer

    __new__.__hybridpar_fix__ = True
    return staticmethod(__new__)


class _StagedCall(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_staged_call = _StagedCall()


def _call_on_stage_device(original):
    """Wraps ``keras.Layer.__call__`` to run a placed layer on its stage's device.

    Upstream (Keras 3.15): under a strategy every op of a replica runs on the
    replica's device; nothing puts a layer's forward ops elsewhere. The
    outermost placed layer of a call opens ``tf.device`` of its stage in the
    running replica, and a ``hybridpar_stage<k>`` name scope that the
    gradient hook below reads; layers inside it inherit both. Layers nothing
    places run on the replica's own device, which is stage 0.
    """

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        placer = staging.placer_for()
        if placer is None or _staged_call.depth:
            return original(self, *args, **kwargs)
        stage = placer.rules.resolve(staging.layer_path(self))
        device = placer.device_for(stage) if stage is not None else None
        if device is None:
            return original(self, *args, **kwargs)
        _staged_call.depth += 1
        try:
            with tf.device(device), tf.name_scope(staging.stage_scope_name(stage)):
                return original(self, *args, **kwargs)
        finally:
            _staged_call.depth -= 1

    __call__.__hybridpar_fix__ = True
    return __call__


def _gradient_on_forward_device(original):
    """Wraps TensorFlow's tape gradient function to run backward ops on the stage.

    Upstream (TF 2.21, ``tensorflow/python/eager/backprop.py``,
    ``_gradient_function``): the gradient of an op recorded by a
    ``GradientTape`` is built under whatever device scope is active at
    ``tape.gradient`` time, not the forward op's device, so every backward
    op of a model-parallel layer would run on the replica's first device.
    The tape hands each gradient function the forward op's name scope; for
    ops recorded inside a ``hybridpar_stage<k>`` scope the gradient is built
    under ``tf.device`` of stage ``k`` in the running replica.
    """

    @functools.wraps(original)
    def gradient_function(
        op_name, attr_tuple, num_inputs, inputs, outputs, out_grads, skip_input_indices,
        forward_pass_name_scope,
    ):
        arguments = (op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                     skip_input_indices, forward_pass_name_scope)
        marker = staging.STAGE_SCOPE_RE.search(forward_pass_name_scope or "")
        placer = staging.placer_for() if marker else None
        device = placer.device_for(int(marker[1])) if placer is not None else None
        if device is None:
            return original(*arguments)
        with ops.device(device):
            return original(*arguments)

    gradient_function.__hybridpar_fix__ = True
    return gradient_function


def _check_placement_before_training(original):
    """Wraps ``TensorFlowTrainer.make_train_function`` to check a staged model once.

    Not an upstream defect: the first point where a model is complete (all
    its layers known and built) before training. Rules that match no layer
    are reported here, and the placement report is logged.
    """

    @functools.wraps(original)
    def make_train_function(self, force=False):
        placer = staging.placer_for(self.distribute_strategy)
        if placer is not None and not getattr(self, "_hybridpar_placement_checked", False):
            from hybridpar import report

            described = report.describe(self, placer)
            if placer.mesh.stages > 1:
                logger.info("%s", described)
            self._hybridpar_placement_checked = True
        return original(self, force)

    make_train_function.__hybridpar_fix__ = True
    return make_train_function


def _install_gradient_hook() -> None:
    current = backprop._gradient_function
    if not getattr(current, "__hybridpar_fix__", False):
        backprop._gradient_function = _gradient_on_forward_device(current)
        pywrap_tfe.TFE_Py_RegisterGradientFunction(backprop._gradient_function)


def _patch(owner: Any, name: str, wrap) -> None:
    current = getattr(owner, name)
    if not getattr(current, "__hybridpar_fix__", False):
        setattr(owner, name, wrap(current))


def install() -> None:
    """Applies every fix once (idempotent). Called when hybridpar builds a strategy."""
    check_versions()
    trainer = keras_tf_trainer.TensorFlowTrainer
    _patch(trainer, "_maybe_symbolic_build", _symbolic_build_from_specs)
    _patch(trainer, "train_step", _train_step_with_replica_share)
    _patch(keras_tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients",
           _gradients_rescaled_by_example_count)
    _patch(keras_tf_trainer, "reduce_per_replica", _mean_over_replicas_for_multi_worker)
    _patch(keras_tf_trainer.TFEpochIterator, "__init__", _batch_unbatched_datasets)
    _patch(keras.callbacks.CallbackList, "set_model", _chief_only_files)
    _patch(keras_loss, "scale_loss_for_distribution",
           functools.partial(_scaled_by_share, invert=False))
    _patch(keras_loss, "unscale_loss_for_distribution",
           functools.partial(_scaled_by_share, invert=True))
    _patch(keras.Layer, "__new__", _record_stage)
    _patch(keras.Layer, "__call__", _call_on_stage_device)
    _patch(trainer, "make_train_function", _check_placement_before_training)
    _install_gradient_hook()
    install_parameter_server_fixes()


def global_batch_size(strategy: tf.distribute.Strategy) -> int | None:
    """The ``data.global_batch_size`` registered for a hybridpar strategy, if any."""
    return _global_batch_sizes.get(strategy)


# --------------------------------------------------------------------------- parameter servers


class ShardView(keras.Variable):
    """A Keras variable over one shard of a ``ShardedVariable`` (no copy).

    Upstream (Keras 3.15 + TF 2.21): a Keras variable built under a
    ParameterServerStrategy with a ``variable_partitioner`` holds a
    ``ShardedVariable``, which has no ``handle``, so ``tape.gradient``
    against the Keras variable raises ``AttributeError: 'ShardedVariable'
    object has no attribute 'handle'``; and the optimizer's slots, colocated
    with the whole ``ShardedVariable``, are created unsharded on the chief.
    A view per shard gives the tape a real resource to differentiate and
    the optimizer one slot set per shard, placed on that shard's ps.
    """

    def __init__(self, shard: tf.Variable, parent: keras.Variable, index: int) -> None:
        self._shard = shard
        super().__init__(
            initializer=lambda shape, dtype: None,
            shape=tuple(shard.shape),
            dtype=parent.dtype,
            trainable=parent.trainable,
            name=f"{parent.path.replace('/', '_')}_shard{index}",
        )

    def _initialize_with_initializer(self, initializer: Any) -> None:
        self._value = self._shard


_viewed_model: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hybridpar_viewed_model", default=None
)


def _sharded(variable: Any) -> sharded_variable.ShardedVariable | None:
    value = getattr(variable, "_value", None)
    return value if isinstance(value, sharded_variable.ShardedVariable) else None


def views_of(variables: list[Any]) -> list[Any]:
    """``variables`` with each sharded Keras variable replaced by its shard views."""
    result = []
    for variable in variables:
        sharded = _sharded(variable)
        if sharded is None:
            result.append(variable)
            continue
        views = getattr(variable, "_hybridpar_shard_views", None)
        if views is None:
            views = [ShardView(shard, variable, i) for i, shard in enumerate(sharded.variables)]
            variable._hybridpar_shard_views = views
        result.extend(views)
    return result


@contextlib.contextmanager
def shard_views(model: Any) -> Iterator[None]:
    """Within the block, ``model.trainable_weights``/``trainable_variables`` list shard views.

    ``model.train_step`` (the user's own, if overridden) then takes gradients
    against the shards and the optimizer updates them; see ``ShardView``.
    """
    token = _viewed_model.set(model)
    try:
        yield
    finally:
        _viewed_model.reset(token)


def _trainables_as_shard_views(original: property) -> property:
    """Wraps ``Layer.trainable_weights``/``trainable_variables`` for ``shard_views``."""

    def getter(self):
        variables = original.fget(self)
        if _viewed_model.get() is self:
            return views_of(variables)
        return variables

    getter.__hybridpar_fix__ = True
    wrapped = property(functools.wraps(original.fget)(getter), original.fset, original.fdel)
    wrapped.fget.__hybridpar_fix__ = True
    return wrapped


_atomic: contextvars.ContextVar[bool] = contextvars.ContextVar("hybridpar_atomic", default=False)


@contextlib.contextmanager
def atomic_updates() -> Iterator[None]:
    """Within the block, Keras variables' ``assign_add``/``assign_sub`` are single ops."""
    token = _atomic.set(True)
    try:
        yield
    finally:
        _atomic.reset(token)


def _atomic_update(original, op: str):
    """Wraps Keras ``Variable.assign_add``/``assign_sub`` for ``atomic_updates``.

    Upstream (Keras 3.15, ``keras/src/backend/common/variables.py``):
    ``assign_add(v)`` is ``assign(self + v)``, a read then a write. Under
    parameter servers, workers update the same variables concurrently and
    updates landing between the read and the write are lost: 20 scheduled
    steps left ``optimizer.iterations`` at 15 here, and metric totals and
    weight updates lose contributions the same way. TensorFlow's resource
    ``AssignAddVariableOp`` is atomic; within ``atomic_updates`` it is used.
    """

    @functools.wraps(original)
    def method(self, value):
        target = getattr(self, "_value", None)
        if not _atomic.get() or not hasattr(target, op):
            return original(self, value)
        return getattr(target, op)(tf.cast(value, target.dtype))

    method.__hybridpar_fix__ = True
    return method


def _sharded_as_numpy(original):
    """Wraps Keras ``Variable.__array__``/``numpy`` to read a sharded variable whole.

    Upstream (Keras 3.15): ``np.asarray(variable)`` calls
    ``variable.value.__array__``, which ``ShardedVariable`` lacks, so
    ``model.save_weights``/``model.save`` fail with "AttributeError:
    'ShardedVariable' object has no attribute '__array__'". The shards are
    read and concatenated (on the chief, when saving).
    """

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        sharded = _sharded(self)
        if sharded is None:
            return original(self, *args, **kwargs)
        value = tf.convert_to_tensor(sharded).numpy()
        dtype = args[0] if args else kwargs.get("dtype")
        return value.astype(dtype) if dtype is not None else value

    method.__hybridpar_fix__ = True
    return method


def _embedding_gathers_from_shards(original):
    """Wraps ``Embedding.call`` to look up a sharded table shard by shard.

    Upstream (Keras 3.15): ``ops.take(self.embeddings, ids)`` converts the
    whole table to one tensor first; for a ``ShardedVariable`` that
    concatenates every shard (the full table crosses the network each step).
    ``tf.nn.embedding_lookup`` on a ``ShardedVariable`` gathers only the
    looked-up rows from each shard, and its gradient is sparse.
    """

    @functools.wraps(original)
    def call(self, inputs):
        table = _sharded(getattr(self, "_embeddings", None))
        if table is None or getattr(self, "lora_enabled", False) or self.quantization_mode:
            return original(self, inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        return tf.cast(tf.nn.embedding_lookup(table, inputs), self.compute_dtype)

    call.__hybridpar_fix__ = True
    return call


_ps_routes: weakref.WeakKeyDictionary[tf.distribute.Strategy, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def route_parameter_server(strategy: tf.distribute.Strategy, fit: Any, evaluate: Any,
                           predict: Any) -> None:
    """Sends ``fit``/``evaluate``/``predict`` of models under ``strategy`` to hybridpar."""
    _ps_routes[strategy] = {"fit": fit, "evaluate": evaluate, "predict": predict}


def _routed_for_parameter_servers(name: str):
    """Wraps ``TensorFlowTrainer.fit``/``evaluate``/``predict`` for parameter servers.

    Upstream (Keras 3.15): nothing in Keras 3 schedules work on the workers
    of a ParameterServerStrategy (keras-team/keras#18624); ``fit`` fails with
    "To use this dataset, you need to pass this dataset to
    ClusterCoordinator.create_per_worker_dataset". Models whose strategy
    hybridpar built for parameter servers go to ``hybridpar.parameter_server``.
    """

    def wrap(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            strategy = getattr(self, "_distribute_strategy", None)
            route = _ps_routes.get(strategy) if strategy is not None else None
            if route is None:
                return original(self, *args, **kwargs)
            return route[name](self, *args, **kwargs)

        method.__hybridpar_fix__ = True
        return method

    return wrap


def keras_evaluate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """Keras's own ``evaluate``, past the parameter-server routing."""
    return keras_tf_trainer.TensorFlowTrainer.evaluate.__wrapped__(model, *args, **kwargs)


def keras_predict(model: Any, *args: Any, **kwargs: Any) -> Any:
    """Keras's own ``predict``, past the parameter-server routing."""
    return keras_tf_trainer.TensorFlowTrainer.predict.__wrapped__(model, *args, **kwargs)


_on_chief: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hybridpar_on_chief", default=None
)


def chief_local_datasets(strategy: tf.distribute.Strategy) -> None:
    """Inside ``chief_only_run``, the strategy hands datasets to Keras unchanged.

    Upstream (TF 2.21): a ParameterServerStrategy's distributed dataset can
    only be iterated on workers; the chief's evaluate/predict read the plain
    dataset and run each step on the chief.
    """
    distribute = strategy.experimental_distribute_dataset

    @functools.wraps(distribute)
    def experimental_distribute_dataset(dataset, options=None):
        if _on_chief.get() is strategy:
            return dataset
        return distribute(dataset, options)

    strategy.experimental_distribute_dataset = experimental_distribute_dataset


@contextlib.contextmanager
def chief_only_run(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Runs ``strategy.run`` on the chief without the "not scheduled" warning per step."""
    token = _on_chief.set(strategy)
    extended = strategy.extended
    previous = extended._allow_run_without_coordinator
    extended._allow_run_without_coordinator = True
    try:
        yield
    finally:
        extended._allow_run_without_coordinator = previous
        _on_chief.reset(token)


def install_parameter_server_fixes() -> None:
    """Applies the parameter-server fixes once (idempotent)."""
    layer = keras.layers.Layer
    for name in ("trainable_weights", "trainable_variables"):
        current = layer.__dict__[name]
        if not getattr(current.fget, "__hybridpar_fix__", False):
            setattr(layer, name, _trainables_as_shard_views(current))
    _patch(keras.layers.Embedding, "call", _embedding_gathers_from_shards)
    for name in ("__array__", "numpy"):
        _patch(keras.Variable, name, _sharded_as_numpy)
    for op in ("assign_add", "assign_sub"):
        _patch(keras.Variable, op, functools.partial(_atomic_update, op=op))
    trainer = keras_tf_trainer.TensorFlowTrainer
    for name in ("fit", "evaluate", "predict"):
        _patch(trainer, name, _routed_for_parameter_servers(name))

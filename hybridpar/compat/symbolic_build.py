"""``fit``/``evaluate``/``predict`` learn input shapes from the dataset's spec, not a batch.

Upstream (Keras 3.15, ``TensorFlowTrainer._maybe_symbolic_build`` in
``keras/src/backend/tensorflow/trainer.py``): under any non-default strategy,
every ``fit``/``evaluate``/``predict`` pulls a real batch from a fresh
iterator just to learn input shapes, and ``strategy.reduce("MEAN", batch)``s
it. That (a) consumes one pass of a reshuffling dataset, so distributed
training sees another data order than single-device training with the same
seed, (b) costs an extra iterator (prefetch fill) per call, and (c) raises
under MultiWorkerMirroredStrategy, where reducing a nested PerReplica batch
fails (keras-team/keras#20585). The symbolic build needs only shapes and
dtypes, which the distributed dataset's ``element_spec`` already has; models
under a strategy hybridpar built use it: their trainer's
``_maybe_symbolic_build`` (``hybridpar.training``, through ``trainer_hooks``)
calls ``build_from_spec`` for a distributed dataset. The same spec shows a model input
built with a fixed batch size that the replicas' batches do not have, which
is refused there, before the first step, instead of failing in one
replica's graph. It is also the last point before the symbolic build builds
the optimizer, so a built model under ``model_parallel.placement: auto`` is
cut into its stages here (``hybridpar.parallel.auto_placement``), its
profile run on one microbatch of the replica batch the spec shows, and a
model under ``model_parallel.tensor > 1`` has its weights split over the
groups (``hybridpar.parallel.tensor_split``); the optimizer is then built on
the shards (``compat.shard_views``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.compat.patching import Fix, register
from hybridpar.compat.shard_views import shard_views
from hybridpar.data import balanced
from hybridpar.errors import ConfigError
from hybridpar.parallel import auto_placement, tensor_split
from hybridpar.state import StrategyState


def _per_replica_spec(spec: Any) -> Any:
    """The spec one replica sees, from a (possibly PerReplica) element spec."""
    value_specs = getattr(spec, "_value_specs", None)
    return value_specs[0] if value_specs else spec


def _input_name(tensor: Any) -> str:
    history = getattr(tensor, "_keras_history", None)
    return history[0].name if history else getattr(tensor, "name", "input")


def check_fixed_batch(model: Any, specs: Any, state: StrategyState) -> None:
    """Refuses a model input built with a batch size the replicas' batches do not have.

    Raises:
        ConfigError: naming the input, the batch each replica gets and the fix.
    """
    replicas = model.distribute_strategy.num_replicas_in_sync
    if replicas == 1:
        return
    x_spec = data_adapter_utils.unpack_x_y_sample_weight(specs)[0]
    leading = {s.shape[0] for s in tf.nest.flatten(x_spec) if getattr(s, "shape", None)}
    per_replica = leading.pop() if len(leading) == 1 else None
    try:
        inputs = list(model.inputs or [])
    except AttributeError:  # a subclassed model has no symbolic inputs
        inputs = []
    for tensor in inputs:
        fixed = tensor.shape[0]
        if fixed is None or fixed == per_replica:
            continue
        gets = (f"{per_replica} examples" if per_replica is not None else
                "a varying number of examples (the batch size is not fixed: a smaller final "
                "batch, or batches split in balanced pieces)")
        shape = tuple(tensor.shape[1:])
        raise ConfigError(
            f"The model's input {_input_name(tensor)!r} has a fixed batch size of {fixed} "
            f"(keras.Input(shape={shape}, batch_size={fixed})), but under "
            f"data_parallel.mode={state.mode!r} each of the {replicas} replicas gets its own "
            f"part of every global batch: {gets}. Build the input without a batch size "
            f"(keras.Input(shape={shape})), or feed global batches of {fixed * replicas} "
            f"examples with drop_remainder=True so that every replica gets exactly {fixed}."
        )


def _microbatch(specs: Any, state: StrategyState) -> int:
    """Examples per microbatch of one replica by the spec (16 when it does not say)."""
    x_spec = data_adapter_utils.unpack_x_y_sample_weight(specs)[0]
    leading = [s.shape[0] for s in tf.nest.flatten(x_spec) if getattr(s, "shape", None)]
    batch = leading[0] if leading and leading[0] is not None else 16 * state.microbatches
    return max(1, batch // state.microbatches)


def build_from_spec(model: Any, dataset: Any, state: StrategyState) -> None:
    """Keras's symbolic build of ``model`` from a distributed dataset's element spec.

    Raises:
        ConfigError: for a model input with a fixed batch size the replicas'
            batches do not have (``check_fixed_batch``).
    """
    specs = tf.nest.map_structure(_per_replica_spec, dataset.element_spec,
                                  expand_composites=False)
    if isinstance(specs, balanced.ReplicaBatch):  # a balanced piece (even_batches)
        specs = specs.data
    check_fixed_batch(model, specs, state)
    if all(layer.built for layer in model._flatten_layers()):
        auto_placement.ensure_placed(model, state.placer, _microbatch(specs, state))
    split = tensor_split.ensure_split(model, state) is not None
    with model.distribute_strategy.scope(), shard_views(model) if split else nullcontext():
        model._symbolic_build(data_batch=specs)


FIX = register(Fix(
    name="symbolic_build",
    corrects="every fit/evaluate/predict under a strategy pulls and reduces a real batch "
             "to learn shapes",
    upstream="keras-team/keras#20585",
    group="core",
    part_of="trainer_hooks",
))

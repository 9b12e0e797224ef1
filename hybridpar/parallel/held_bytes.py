"""Bytes of variables by device: what a set of variables holds, and what was created since.

A variable's storage is each of its eager ``tf.Variable`` components: a
``keras.Variable``'s value, every copy of a mirrored (or sync-on-read)
variable on its own device, every shard of a tensor-parallel weight
(``split_variable.SplitVariable``) on its own devices. ``live_variables``
finds every stored variable the process holds (``gc`` over ``tf.Variable``
and ``keras.Variable`` objects), so ``created`` counts what building and
training made, e.g. ZeRO's sharded state against an unsharded optimizer's,
with nothing left out.

    before = held_bytes.snapshot()
    ...build, compile and fit a model...
    held_bytes.created(before, less=model.weights)  # {device: bytes}

"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf

from hybridpar.parallel.split_variable import SplitVariable


def storage(variables: Iterable[Any]) -> list[tf.Variable]:
    """The eager component variables of ``variables``, each once, in order."""
    seen: dict[str, tf.Variable] = {}
    for variable in variables:
        value = variable.value if isinstance(variable, keras.Variable) else variable
        shards = value.variables if isinstance(value, SplitVariable) else [value]
        for part in (p for shard in shards for p in getattr(shard, "values", [shard])):
            if isinstance(part, tf.Variable) and not getattr(part, "_in_graph_mode", False):
                seen.setdefault(part._unique_id, part)
    return list(seen.values())


def variable_bytes_by_device(variables: Iterable[Any]) -> dict[str, int]:
    """Bytes each device holds of ``variables`` (every copy of a mirrored variable counted
    on its own device), read from the variables' devices and sizes."""
    held: dict[str, int] = {}
    for part in storage(variables):
        spec = tf.DeviceSpec.from_string(part.device)
        device = f"/job:{spec.job}/task:{spec.task}/device:{spec.device_type}:" \
                 f"{spec.device_index}"
        size = part.shape.num_elements() * tf.as_dtype(part.dtype).size
        held[device] = held.get(device, 0) + size
    return held


def live_variables() -> list[tf.Variable]:
    """The storage of every variable alive in this process (after a garbage collection)."""
    gc.collect()
    return storage(o for o in gc.get_objects() if isinstance(o, (tf.Variable, keras.Variable)))


def snapshot() -> frozenset[str]:
    """The variables alive now, by ``_unique_id`` (never reused within a process)."""
    return frozenset(part._unique_id for part in live_variables())


def created(before: frozenset[str], less: Iterable[Any] = ()) -> dict[str, int]:
    """Bytes by device of the variables alive now that were not in ``before``
    (``snapshot``), leaving out the storage of ``less`` (a model's weights)."""
    left_out = before | {part._unique_id for part in storage(less)}
    return variable_bytes_by_device(v for v in live_variables()
                                    if v._unique_id not in left_out)

"""A sharded Keras variable converts to one numpy array, so models with one save.

Upstream (Keras 3.15): ``np.asarray(variable)`` calls
``variable.value.__array__``, which ``ShardedVariable`` lacks, so
``model.save_weights``/``model.save`` fail with "AttributeError:
'ShardedVariable' object has no attribute '__array__'". For variables a
hybridpar parameter-server strategy sharded, the shards are read and
concatenated (on the chief, when saving). Installed only while such a
strategy is alive.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.compat.shard_views import sharded
from hybridpar.state import state_of


def _owned_table(self, *args, **kwargs) -> bool:
    table = sharded(self)
    return table is not None and state_of(table._distribute_strategy) is not None


def _read_whole(original: Any) -> Any:
    def method(self, *args, **kwargs):
        value = tf.convert_to_tensor(sharded(self)).numpy()
        dtype = args[0] if args else kwargs.get("dtype")
        return value.astype(dtype) if dtype is not None else value

    return method


FIX = register(Fix(
    name="sharded_numpy",
    corrects="np.asarray of a sharded Keras variable fails, so save_weights/save fail",
    group="parameter_server",
    patches=tuple(Patch(keras.Variable, name, _read_whole, owns=_owned_table)
                  for name in ("__array__", "numpy")),
))

"""A replica's flat shard of one ZeRO bucket as its optimizer sees it, holding no storage.

A replica optimizer (``hybridpar.parallel.zero``) is built on one ``ShardValue``
per bucket and updates it; the weights it stands for live in the model's
variables, so a variable holding a copy of them would only add a shard's bytes
per replica. Keras 3.15's TF optimizer reads of it: ``shape``, ``dtype``,
``path`` and ``device`` to build the slots (``add_variable_from_reference``,
colocated by ``_ReplicaLocal``), ``_unique_id`` as its key
(``TFOptimizer._var_key``), and in ``update_step`` ``dtype``, the key and its
``assign``/``assign_add``/``assign_sub``. Within ``bound(tensor)`` it is that
tensor (the replica's shard of the weights), each assign rebinding it to a new
tensor, and converts to the latest (``tf.convert_to_tensor``, ``keras.ops``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

_IDS = itertools.count()


class ShardValue:
    """The flat shard of a bucket one replica updates: a tensor bound during the step.

    Args:
        name: its name and path, which the slots' names start with
            (``zero_shard_0_replica_1`` gives ``adam/zero_shard_0_replica_1_momentum``).
        shard_size: elements per shard.
        dtype: the bucket's dtype.
        device: where the replica holds the bucket's variables, and so its slots.
    """

    def __init__(self, name: str, shard_size: int, dtype: Any, device: str) -> None:
        self.name = self.path = name
        self.shape = tf.TensorShape([shard_size])
        self.dtype = tf.as_dtype(dtype).name
        self.device = device
        self._unique_id = f"{name}/shard_value_{next(_IDS)}"
        self._value: tf.Tensor | None = None

    @contextlib.contextmanager
    def bound(self, value: Any) -> Iterator[ShardValue]:
        """Makes this shard ``value`` (``shape``, ``dtype``) until the block ends."""
        self._value = tf.convert_to_tensor(value, self.dtype)
        self._value.shape.assert_is_compatible_with(self.shape)
        try:
            yield self
        finally:
            self._value = None

    def _read(self) -> tf.Tensor:
        if self._value is None:
            raise RuntimeError(f"hybridpar: shard {self.name!r} was read outside "
                               "ShardValue.bound(); it has no value of its own.")
        return self._value

    def assign(self, value: Any) -> ShardValue:
        self._read()
        self._value = tf.convert_to_tensor(value, self.dtype)
        return self

    def assign_add(self, delta: Any) -> ShardValue:
        return self.assign(self._read() + tf.convert_to_tensor(delta, self.dtype))

    def assign_sub(self, delta: Any) -> ShardValue:
        return self.assign(self._read() - tf.convert_to_tensor(delta, self.dtype))

    def __tf_tensor__(self, dtype: Any = None, name: str | None = None) -> tf.Tensor:
        return tf.convert_to_tensor(self._read(), dtype=dtype, name=name)

    def __repr__(self) -> str:
        return f"<ShardValue {self.name} shape={self.shape} dtype={self.dtype}>"

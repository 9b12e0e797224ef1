"""Each strategy hybridpar builds gets collective keys of its own.

Upstream (TF 2.21, ``mirrored_strategy.MirroredStrategy`` and
``collective_all_reduce_strategy.CollectiveAllReduceStrategy``): every
instance starts its collective group keys at ``1 + _collective_key_base``, a
class attribute that is 0, so a second strategy over other devices in the
same process reuses group key 1 and the runtime aborts with "is joining a
group that is already full (group_key=1)". TensorFlow's own tests raise the
class attribute between instances; hybridpar's strategy classes set it per
instance instead, before the ``tf.distribute`` initialiser reads it.
"""

from __future__ import annotations

import itertools

KEY_BASE_STRIDE = 100_000
_key_bases = itertools.count(1)


def next_key_base() -> int:
    """A collective key base no other strategy of this process uses."""
    return next(_key_bases) * KEY_BASE_STRIDE

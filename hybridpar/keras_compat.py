"""Every workaround for Keras or TensorFlow internals, in one place.

Each fix names the upstream behaviour it corrects, is guarded by the versions
it was verified against, and has a test in ``tests/strategy/test_keras_compat.py``
that reproduces the upstream behaviour without hybridpar, so we learn when
upstream changes.
"""

from __future__ import annotations

import itertools

import keras
import tensorflow as tf
from tensorflow.python.distribute import (
    collective_util,
    cross_device_ops as cross_device_ops_lib,
    cross_device_utils,
)

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
    return strategy

"""What a parameter-server chief made before it connected to the cluster.

Upstream (TF 2.21, ``tf.config.experimental_connect_to_cluster``, which the
``ParameterServerStrategy`` constructor calls): connecting renames the
process's local job from ``localhost`` to ``chief``, and whatever was
created before stays on ``/job:localhost``, a device the context no longer
knows. Iterating a ``tf.data`` dataset made before the connection fails with
"/job:localhost/replica:0/task:0/device:CPU:0 unknown device.
[Op:AnonymousIteratorV3]"; reading a variable made before it with "Client
for target /job:localhost/replica:0/task:0 not found". Yet the order of
TensorFlow's tutorials builds the datasets first, which under hybridpar is
before ``hybridpar.scope()``, where the chief connects.

This module tells a stranded device (``connected_job``, ``stranded``):
``model_scope`` checks models with it, and the parameter-server runner moves
datasets onto the chief with ``hybridpar.strategies.chief_datasets`` (an
override).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import context

from hybridpar.compat.patching import Fix, register

LOCALHOST = "localhost"


def connected_job() -> str | None:
    """This process's job once it connected to a cluster (``chief``, ``worker``), else None."""
    server_def = context.get_server_def()
    return server_def.job_name if server_def is not None and server_def.job_name else None


def stranded(device: str) -> bool:
    """True for a device of ``/job:localhost`` after the connection removed that job."""
    job = connected_job()
    return job not in (None, LOCALHOST) and tf.DeviceSpec.from_string(device).job == LOCALHOST


FIX = register(Fix(
    name="local_job",
    corrects="a dataset or model created before the parameter-server chief connects stays "
             "on /job:localhost, which connecting removes (unknown device)",
    group="parameter_server",
))

"""What a parameter-server chief made before it connected, WITHOUT hybridpar.

Run by ``hybridpar launch --workers 1 --ps 1``: worker and ps tasks serve; the
chief makes a dataset, a Python-generator dataset and a variable, then builds
``ParameterServerStrategy`` (which connects to the cluster) and prints one JSON
line: what fails afterwards, and that ``take(-1)`` made on the chief's device
iterates the same pipeline, shuffle included, but not its Python generator
(what ``hybridpar.strategies.chief_datasets`` relies on).
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if task["type"] in ("worker", "ps"):
    tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"],
                         task_index=task["index"], protocol="grpc").join()
values = np.arange(64, dtype="float32").reshape(16, 4)
dataset = tf.data.Dataset.from_tensor_slices(values).shuffle(16, seed=3).batch(4)
generated = tf.data.Dataset.from_generator(
    lambda: iter(values), output_signature=tf.TensorSpec([4], tf.float32)).batch(4)
variable = tf.Variable(1.0)


def rows(data: tf.data.Dataset) -> list:
    return sorted(row for batch in data for row in batch.numpy().tolist())


before = rows(dataset)
tf.distribute.experimental.ParameterServerStrategy(resolver)


def outcome(call) -> str:
    try:
        return json.dumps(call())
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
    moved, moved_generated = dataset.take(-1), generated.take(-1)
print(json.dumps({
    "device": dataset._variant_tensor.device,
    "iterate": outcome(lambda: next(iter(dataset)).numpy().tolist()),
    "read_variable": outcome(lambda: float(variable.numpy())),
    "moved_device": moved._variant_tensor.device,
    "moved_equal": outcome(lambda: rows(moved) == before),
    "moved_generator": outcome(lambda: next(iter(moved_generated)).numpy().tolist()),
}), flush=True)

"""Keras 3 `model.fit` under ParameterServerStrategy WITHOUT hybridpar.

Run by ``hybridpar launch --workers 1 --ps 1``: worker and ps tasks serve; the
chief builds the strategy and a ClusterCoordinator as TensorFlow's guide does,
then calls plain ``model.fit``, which fails (keras-team/keras#18624).
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if task["type"] in ("worker", "ps"):
    tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"],
                         task_index=task["index"], protocol="grpc").join()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
data = tf.data.Dataset.from_tensor_slices((np.ones((32, 4), "float32"),
                                           np.ones((32, 1), "float32"))).repeat().batch(8)
model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)

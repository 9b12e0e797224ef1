"""Keras's file-writing callbacks under MultiWorkerMirroredStrategy, WITHOUT hybridpar.

Run on every worker of a cluster; all write to the directory given as argv[1].
Upstream Keras callbacks know nothing of chiefs, so each worker writes its own
TensorBoard event file and CSV rows there. (model.fit itself fails upstream
under this strategy, so the callbacks are driven by hand, as fit would.)
"""

import os
import sys

import keras
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
callbacks = keras.callbacks.CallbackList(
    [keras.callbacks.TensorBoard(log_dir=os.path.join(sys.argv[1], "tensorboard")),
     keras.callbacks.CSVLogger(os.path.join(sys.argv[1], f"log-{os.getpid()}.csv"))],
    model=model,
)
callbacks.on_train_begin()
callbacks.on_epoch_begin(0)
callbacks.on_epoch_end(0, {"loss": 1.0})
callbacks.on_train_end()

"""BEFORE: Horovod with tf.keras (the pattern of Horovod's Keras examples).

Horovod does not build on TensorFlow >= 2.16; this script shows what teams run
today and is not executed here. Each rank trains on its slice of every global
batch, the optimizer is wrapped to all-reduce the gradients, rank 0's initial
weights are broadcast, and only rank 0 writes checkpoints:

    horovodrun -np 2 python before.py --out DIR
"""

import argparse
import json
import pathlib

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

GLOBAL_BATCH, EPOCHS = 64, 3

hvd.init()
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def dataset() -> tf.data.Dataset:
    """1024 seeded examples; this rank's share of each global batch of 64."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    return data.unbatch().shard(hvd.size(), hvd.rank()).batch(GLOBAL_BATCH // hvd.size())


def initial_weights() -> list[np.ndarray]:
    """Seeded weights, so that every guide's scripts start from the same point."""
    rng = np.random.default_rng(1)
    return [rng.uniform(-0.25, 0.25, (16, 64)).astype("float32"), np.zeros(64, "float32"),
            rng.uniform(-0.25, 0.25, (64, 2)).astype("float32"), np.zeros(2, "float32")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    model = tf.keras.Sequential([
        tf.keras.Input((16,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.set_weights(initial_weights())
    # The global batch stays 64, so the learning rate is not scaled by hvd.size().
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    if hvd.rank() == 0:  # only rank 0 writes checkpoints
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            str(args.out / "checkpoints" / "epoch-{epoch}.weights.h5"), save_weights_only=True))
    history = model.fit(dataset(), epochs=EPOCHS, callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "num_replicas": hvd.size(),
              "weights": [w.tolist() for w in model.get_weights()]}
    (args.out / f"worker-{hvd.rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

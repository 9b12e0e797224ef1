"""AFTER: the Horovod script as Keras 3 with hybridpar (multi-worker mode).

No hvd.init, no DistributedOptimizer (the strategy all-reduces the
gradients), no broadcast callback (the variables are created identical on
every worker) and no rank-0 branch (the chief writes hybridpar's
checkpoints). The config names the mode; ``model.fit`` is Keras's own.
Start the workers with the launcher instead of horovodrun:

    hybridpar launch --workers 2 -- python after.py --out DIR
    python after.py --out DIR --mode none          # the same run on one device
"""

import argparse
import json
import pathlib

import keras
import numpy as np
import tensorflow as tf

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op

GLOBAL_BATCH, EPOCHS = 64, 3


def dataset() -> tf.data.Dataset:
    """1024 seeded examples; hybridpar shards the global batches over the workers."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def initial_weights() -> list[np.ndarray]:
    """Seeded weights, so that every guide's scripts start from the same point."""
    rng = np.random.default_rng(1)
    return [rng.uniform(-0.25, 0.25, (16, 64)).astype("float32"), np.zeros(64, "float32"),
            rng.uniform(-0.25, 0.25, (64, 2)).astype("float32"), np.zeros(2, "float32")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--mode", default="multi_worker")
    args = parser.parse_args()
    config = {"data_parallel": {"mode": args.mode},
              "data": {"global_batch_size": GLOBAL_BATCH, "shard_policy": "data"},
              "checkpoint": {"dir": str(args.out / "checkpoints"), "every_epochs": 1}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(2),
        ])
        model.set_weights(initial_weights())
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = hs.callbacks()  # the chief writes the checkpoints
    history = model.fit(dataset(), epochs=EPOCHS, verbose=2, callbacks=callbacks)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "mode": hs.mode,
              "num_replicas": hs.num_replicas,
              "weights": [w.tolist() for w in model.get_weights()]}
    task = f"worker-{hs.cluster.task_index}" if hs.cluster else "single"
    (args.out / f"{task}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

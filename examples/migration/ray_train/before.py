"""BEFORE: a Ray Train TensorflowTrainer example with tf_keras (TF_USE_LEGACY_KERAS=1).

Ray Train sets TF_CONFIG on each worker; the loop builds
MultiWorkerMirroredStrategy itself, the tf_keras model inside its scope, and
reports each epoch's loss to Ray by hand:

    python before.py --out DIR [--address ADDRESS]
"""

import argparse
import os
import pathlib

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # Keras 2 (tf_keras) on the driver and workers

import ray
from ray import train
from ray.train.tensorflow import TensorflowTrainer

GLOBAL_BATCH, EPOCHS, WORKERS = 64, 3, 2


def train_loop(config: dict) -> None:
    """Ray Train's ``train_loop_per_worker``: 3 epochs of tf_keras ``fit`` under MWMS."""
    import json

    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    rng = np.random.default_rng(1)  # seeded weights: every guide starts from the same point
    weights = [rng.uniform(-0.25, 0.25, (16, 64)).astype("float32"), np.zeros(64, "float32"),
               rng.uniform(-0.25, 0.25, (64, 2)).astype("float32"), np.zeros(2, "float32")]
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((16,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ])
        model.set_weights(weights)
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: train.report({"epoch": epoch, "loss": logs["loss"]}))
    history = model.fit(data, epochs=EPOCHS, verbose=2, callbacks=[report])
    rank = train.get_context().get_world_rank()
    out = pathlib.Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "num_replicas": strategy.num_replicas_in_sync,
              "weights": [w.tolist() for w in model.get_weights()]}
    (out / f"worker-{rank}.json").write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--address", default=None, help="a running Ray cluster")
    args = parser.parse_args()
    ray.init(address=args.address,
             runtime_env={"env_vars": {"TF_USE_LEGACY_KERAS": "1"}})
    trainer = TensorflowTrainer(
        train_loop, train_loop_config={"out": str(args.out)},
        scaling_config=train.ScalingConfig(num_workers=WORKERS),
        run_config=train.RunConfig(storage_path=str(args.out.resolve() / "ray_results"),
                                   name="before"),
    )
    trainer.fit()  # raises if a worker failed; the losses Ray got are the reported metrics


if __name__ == "__main__":
    main()

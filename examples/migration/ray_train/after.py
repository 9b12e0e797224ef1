"""AFTER: the Ray Train example with Keras 3 and hybridpar.

The loop does not build a strategy: ``hybridpar.scope`` reads the TF_CONFIG
Ray sets, Keras 3 trains even though Ray still exports TF_USE_LEGACY_KERAS=1,
and ``hybridpar.ray_train.RayTrainReport`` reports each epoch (and hybridpar's
checkpoints) to Ray:

    python after.py --out DIR [--address ADDRESS]
"""

import argparse
import pathlib

import ray
from ray import train
from ray.train.tensorflow import TensorflowTrainer

GLOBAL_BATCH, EPOCHS, WORKERS = 64, 3, 2


def train_loop(config: dict) -> None:
    """Ray Train's ``train_loop_per_worker``: 3 epochs of plain Keras 3 ``fit``."""
    import json

    import keras
    import numpy as np
    import tensorflow as tf

    import hybridpar

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    rng = np.random.default_rng(1)  # seeded weights: every guide starts from the same point
    weights = [rng.uniform(-0.25, 0.25, (16, 64)).astype("float32"), np.zeros(64, "float32"),
               rng.uniform(-0.25, 0.25, (64, 2)).astype("float32"), np.zeros(2, "float32")]
    settings = {"data_parallel": {"mode": "multi_worker"},
                "data": {"global_batch_size": GLOBAL_BATCH, "shard_policy": "data"},
                "checkpoint": {"dir": str(pathlib.Path(config["out"]) / "checkpoints"),
                               "every_epochs": 1}}
    with hybridpar.scope(settings) as hs:
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(2),
        ])
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [*hs.callbacks(), hybridpar.ray_train.RayTrainReport(hs)]
    history = model.fit(data, epochs=EPOCHS, verbose=2, callbacks=callbacks)
    out = pathlib.Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "mode": hs.mode,
              "num_replicas": hs.num_replicas,
              "weights": [w.tolist() for w in model.get_weights()]}
    (out / f"worker-{hs.cluster.task_index}.json").write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--address", default=None, help="a running Ray cluster")
    args = parser.parse_args()
    ray.init(address=args.address)
    trainer = TensorflowTrainer(
        train_loop, train_loop_config={"out": str(args.out)},
        scaling_config=train.ScalingConfig(num_workers=WORKERS),
        run_config=train.RunConfig(storage_path=str(args.out.resolve() / "ray_results"),
                                   name="after"),
    )
    result = trainer.fit()
    print("final step:", result.metrics["step"])


if __name__ == "__main__":
    main()

"""BEFORE: tf_keras with MultiWorkerMirroredStrategy (TF_USE_LEGACY_KERAS=1).

Every worker runs this script with its own TF_CONFIG. The strategy is built by
hand before any other TensorFlow op, the model and optimizer inside its scope,
and only the chief keeps the checkpoint the tutorial's workaround writes:

    TF_CONFIG=... python before.py --out DIR     # on every worker
"""

import argparse
import json
import os
import pathlib
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras (Keras 2)

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op

GLOBAL_BATCH, EPOCHS = 64, 3


def dataset() -> tf.data.Dataset:
    """1024 seeded examples; TensorFlow shards the global batches over the workers."""
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
    args = parser.parse_args()
    resolver = strategy.cluster_resolver
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((16,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ])
        model.set_weights(initial_weights())
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset(), epochs=EPOCHS, verbose=2)
    is_chief = resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0)
    # Every worker must save (the save is collective); non-chiefs write to a throwaway dir.
    save_dir = args.out / "model" if is_chief else pathlib.Path(tempfile.mkdtemp())
    model.save_weights(str(save_dir / "weights"))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "num_replicas": strategy.num_replicas_in_sync,
              "weights": [w.tolist() for w in model.get_weights()]}
    task = f"{resolver.task_type}-{resolver.task_id}"
    (args.out / f"{task}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

"""BEFORE: tf_keras with ParameterServerStrategy (TF_USE_LEGACY_KERAS=1).

As TensorFlow's parameter-server tutorial does: worker and ps tasks start a
``tf.distribute.Server`` and block; the chief builds the strategy, and
``model.fit`` runs through the ClusterCoordinator that tf_keras creates for it.
The input must be a ``DatasetCreator`` (a function each worker calls) and every
epoch needs an explicit ``steps_per_epoch``:

    TF_CONFIG=... python before.py --out DIR     # on the chief, workers and ps
"""

import argparse
import json
import os
import pathlib

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras (Keras 2)

import numpy as np
import tensorflow as tf

GLOBAL_BATCH, EPOCHS, EXAMPLES = 64, 3, 1024


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    """1024 seeded examples, repeated: each worker pulls batches as it schedules steps."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)


def initial_weights() -> list[np.ndarray]:
    """Seeded weights, so that every guide's scripts start from the same point."""
    rng = np.random.default_rng(1)
    return [rng.uniform(-0.25, 0.25, (16, 64)).astype("float32"), np.zeros(64, "float32"),
            rng.uniform(-0.25, 0.25, (64, 2)).astype("float32"), np.zeros(2, "float32")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                             task_index=resolver.task_id, protocol="grpc").join()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((16,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ])
        model.set_weights(initial_weights())
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS,
                        steps_per_epoch=EXAMPLES // GLOBAL_BATCH, verbose=2)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"],
              "weights": [w.tolist() for w in model.get_weights()]}
    (args.out / "chief.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

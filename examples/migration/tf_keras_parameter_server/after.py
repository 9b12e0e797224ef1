"""AFTER: the same parameter-server training with Keras 3 and hybridpar.

Every task runs this same script: on worker and ps tasks ``hybridpar.scope``
serves the cluster and never returns; on the chief it builds the strategy and
the ClusterCoordinator, and plain ``model.fit`` takes the ordinary dataset
(no DatasetCreator; workers read it endlessly, so an epoch is still
``steps_per_epoch`` steps):

    hybridpar launch --workers 1 --ps 2 -- python after.py --out DIR
    python after.py --out DIR --mode none          # the same run on one device
"""

import argparse
import json
import pathlib

import keras
import numpy as np
import tensorflow as tf

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op

GLOBAL_BATCH, EPOCHS, EXAMPLES = 64, 3, 1024


def dataset() -> tf.data.Dataset:
    """1024 seeded examples in global batches of 64."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 16)).astype("float32")
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
    parser.add_argument("--mode", default="parameter_server")
    args = parser.parse_args()
    config = {"data_parallel": {"mode": args.mode},
              "data": {"global_batch_size": GLOBAL_BATCH}}
    with hybridpar.scope(config) as hs:  # worker and ps tasks serve here
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(2),
        ])
        model.set_weights(initial_weights())
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=EXAMPLES // GLOBAL_BATCH,
                        verbose=2)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"loss": history.history["loss"], "mode": hs.mode,
              "weights": [w.tolist() for w in model.get_weights()]}
    (args.out / f"{'chief' if hs.cluster else 'single'}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

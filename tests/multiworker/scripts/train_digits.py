"""A plain Keras `model.fit` script, as a user writes it, run by the multi-worker tests.

It builds its tf.data pipeline before entering `hybridpar.scope()` and
calls the unmodified `model.fit`. It counts which example ids each worker
trained on, and writes its final weights, history and counts to
`<out>/<task>.json` (task = $HYBRIDPAR_TASK, or "single").
"""

import argparse
import json
import os
import pathlib
import signal

import keras
import numpy as np
import tensorflow as tf

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op below

hybridpar.log_to_stderr()  # show hybridpar's own lines: mode, sharding, checkpoints

NUM_EXAMPLES = 1797


class IdCounter(keras.layers.Layer):
    """Counts how often each example id passes through in training."""

    def build(self, input_shape):
        with tf.init_scope():  # Keras may build inside a trace
            self.counts = tf.Variable(
                tf.zeros([NUM_EXAMPLES], tf.int64), trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

    def call(self, ids, training=False):
        if training:
            self.counts.assign_add(tf.math.bincount(
                tf.cast(ids, tf.int32), minlength=NUM_EXAMPLES, maxlength=NUM_EXAMPLES,
                dtype=tf.int64))
        return ids

    def local_counts(self) -> np.ndarray:
        copies = getattr(self.counts, "values", (self.counts,))
        return np.sum([c.numpy() for c in copies], axis=0)


class Classifier(keras.Model):
    def __init__(self):
        super().__init__()
        self.counter = IdCounter()
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.logits = keras.layers.Dense(10)

    def call(self, inputs, training=False):
        self.counter(inputs["id"], training=training)
        x = self.flatten(tf.cast(inputs["image"], tf.float32) / 255.0)
        return self.logits(self.hidden(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--shard_policy", default="auto")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--fail_task", default="", help="this task dies at --fail_epoch")
    parser.add_argument("--fail_epoch", type=int, default=0)
    parser.add_argument("--fail_signal", action="store_true", help="SIGKILL instead of exit 3")
    parser.add_argument("--callbacks_dir", default="", help="add Keras's file-writing callbacks")
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--jit_compile", action="store_true")
    args = parser.parse_args()
    task = os.environ.get("HYBRIDPAR_TASK", "single")

    dataset = hybridpar.data.load_tfds("hybridpar_digits", "train", args.data_dir)
    dataset = dataset.map(lambda e: ({"image": e["image"], "id": e["id"]}, e["label"]))
    if args.shuffle:
        dataset = dataset.shuffle(2048, seed=5)

    keras.utils.set_random_seed(11)
    config = {"data": {"global_batch_size": args.batch, "shard_policy": args.shard_policy},
              "communication": {"timeout_seconds": args.timeout}}
    with hybridpar.scope(config) as hs:
        model = Classifier()
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=args.steps_per_execution,
                      jit_compile=args.jit_compile)

    def fail(epoch, logs=None):
        if task == args.fail_task and epoch == args.fail_epoch:
            print(f"{task} fails at epoch {epoch}", flush=True)
            if args.fail_signal:
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)

    callbacks = [keras.callbacks.LambdaCallback(on_epoch_begin=fail)]
    if args.callbacks_dir:
        files = pathlib.Path(args.callbacks_dir)
        callbacks += [
            keras.callbacks.TensorBoard(log_dir=str(files / "tensorboard")),
            keras.callbacks.ModelCheckpoint(str(files / "model.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.CSVLogger(str(files / "log.csv")),
            keras.callbacks.BackupAndRestore(str(files / "backup"), delete_checkpoint=False),
        ]
    history = model.fit(dataset, epochs=args.epochs, verbose=2, callbacks=callbacks)
    evaluation = model.evaluate(dataset.take(200), return_dict=True, verbose=0)
    predictions = model.predict(dataset.take(100).map(lambda x, y: x), verbose=0)
    result = {
        "evaluation": evaluation, "predictions_shape": list(predictions.shape),
        "task": task, "mode": hs.mode, "num_replicas": hs.num_replicas, "is_chief": hs.is_chief,
        "history": history.history,
        "weights": [w.tolist() for w in model.get_weights()],
        "counts": model.counter.local_counts().tolist(),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task.replace(':', '-')}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

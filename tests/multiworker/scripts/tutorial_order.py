"""A Keras script in the order of TensorFlow's distributed-training tutorials, for every mode.

Data first: a tfds split (``hybridpar.data.load_tfds``), a ``tf.data`` pipeline
over numpy arrays, the arrays themselves and a callback, all made before
``hybridpar.scope()``; then the scope with the model and ``compile`` inside;
then ``model.fit`` with ``validation_data``, ``evaluate`` and ``predict``, as the
MultiWorkerMirroredStrategy and ParameterServerStrategy tutorials do. The same
datasets are made again after the scope, and ``evaluate``/``predict`` run on
both. Two orders that cannot work are tried and their errors recorded: a model
built before the scope, and (meaningful on a parameter-server chief) a
``from_generator`` dataset made before it.

    python tutorial_order.py --mode none|hybrid_2x2 --out DIR --data_dir D
    hybridpar launch --workers 2 -- python tutorial_order.py --mode multi_worker ...
    hybridpar launch --workers 2 --ps 1 --evaluator -- python tutorial_order.py \\
        --mode parameter_server --checkpoint_dir C ...

Every task that returns from the scope (a worker of multi_worker, the chief,
the evaluator) writes ``DIR/<task>.json`` and ``DIR/<task>.npz`` (final
weights, predictions, the arrays it evaluated).
"""

import argparse
import json
import os
import pathlib
import sys

import hybridpar  # joins a multi-worker TF_CONFIG cluster before the first op below

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True,
                    choices=["none", "hybrid_2x2", "multi_worker", "parameter_server"])
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--data_dir", required=True)
parser.add_argument("--checkpoint_dir", default=None)
args = parser.parse_args()
if args.mode == "hybrid_2x2":
    hybridpar.testing.use_logical_cpus(4)  # a CPU-only machine: 4 logical devices

import hybridpar_models  # noqa: E402  (after the devices are set up)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hybridpar.log_to_stderr()
TASK = os.environ.get("HYBRIDPAR_TASK", "single").replace(":", "-")
BATCH, EPOCHS, STEPS, VALIDATION_STEPS = 64, 2, 6, 3


def digits(split: str) -> tf.data.Dataset:
    return hybridpar.data.load_tfds("hybridpar_digits", split, args.data_dir,
                                    as_supervised=True).batch(BATCH)


class Record(keras.callbacks.Callback):
    """What fit reported: train batches and the logs of each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.epoch_logs: list[list[str]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1] += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(sorted(logs or {}))


def outcome(call) -> str:
    try:
        call()
    except Exception as error:  # recorded for the test to read
        return f"{type(error).__name__}: {error}"
    return "ok"


# ---- data first, as the tutorials do --------------------------------------------------
images, labels = next(iter(digits("test").unbatch().batch(1000)))
x_test, y_test = images.numpy(), labels.numpy()
train_first = digits("train").repeat()
validation_first = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(BATCH)
tfds_first = digits("test")
generated_first = tf.data.Dataset.from_generator(
    lambda: iter(zip(x_test, y_test, strict=True)),
    output_signature=(tf.TensorSpec([8, 8, 1], tf.uint8), tf.TensorSpec([], tf.int64)),
).batch(BATCH)
record = Record()
model_first = hybridpar_models.get("digits_mlp")()

config = {"data_parallel": {"mode": "mirrored" if args.mode == "hybrid_2x2" else args.mode},
          "data": {"global_batch_size": BATCH}}
if args.mode == "hybrid_2x2":
    config["model_parallel"] = {"stages": 2, "placement": {"^hidden$": 0, "^logits$": 1}}
if args.checkpoint_dir:
    config["checkpoint"] = {"dir": args.checkpoint_dir, "every_epochs": 1}
    config["evaluator"] = {"poll_seconds": 0.2}


def compile_model(model: keras.Model) -> None:
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


keras.utils.set_random_seed(7)
with hybridpar.scope(config) as hs:
    model = hybridpar_models.get("digits_mlp")()
    compile_model(model)
    model_first_compile = outcome(lambda: compile_model(model_first))

# ---- the same data made after the scope --------------------------------------------------
validation_after = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(BATCH)
tfds_after = digits("test")

history = model.fit(train_first, validation_data=validation_first, epochs=EPOCHS,
                    steps_per_epoch=STEPS, validation_steps=VALIDATION_STEPS,
                    callbacks=[record, *hs.callbacks()], verbose=2)
inputs = {"tfdata_first": validation_first, "tfdata_after": validation_after,
          "tfds_first": tfds_first, "tfds_after": tfds_after}
evaluation = {name: model.evaluate(data, return_dict=True, verbose=0)
              for name, data in inputs.items()}
evaluation["numpy"] = model.evaluate(x_test, y_test, batch_size=BATCH, return_dict=True,
                                     verbose=0)
predictions = {name: model.predict(data, verbose=0) for name, data in inputs.items()}
predictions["numpy"] = model.predict(x_test, batch_size=BATCH, verbose=0)
result = {
    "task": TASK, "mode": hs.mode, "is_evaluator": hs.is_evaluator,
    "iterations": int(model.optimizer.iterations.numpy()),
    "batches_per_epoch": record.batches, "epoch_logs": record.epoch_logs,
    "history": history.history, "history_epochs": history.epoch,
    "evaluation": evaluation,
    "model_first_compile": model_first_compile,
    "model_first_predict": outcome(lambda: model_first.predict(x_test, verbose=0)),
    "generated_first_evaluate": outcome(lambda: model.evaluate(generated_first, verbose=0)),
}
args.out.mkdir(parents=True, exist_ok=True)
np.savez(args.out / f"{TASK}.npz", x_test=x_test, y_test=y_test,
         **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
         **{f"predict_{name}": value for name, value in predictions.items()})
(args.out / f"{TASK}.json").write_text(json.dumps(result, indent=1))
print(f"{TASK} done", file=sys.stderr)

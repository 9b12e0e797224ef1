"""A plain `model.fit` script for the parameter-server tests.

Run by ``hybridpar launch --workers N --ps M -- python train_ps.py --out DIR ...``:
every task runs it; worker and ps tasks block in ``hybridpar.scope()``; the
chief trains the wide-and-deep recommender (small tables) on hybridpar_clicks
examples and writes ``DIR/chief-<restart>.json``. Each task first writes its
pid to ``DIR/pid-<task>`` so the chief can kill one (``--kill``) mid-training,
or send itself SIGTERM (``--term_at``). On an evaluator task (``launch
--evaluator``) the same ``fit`` evaluates the chief's checkpoints and the
script writes ``DIR/evaluator-<restart>.json``.
"""

import argparse
import json
import os
import pathlib
import signal
import time

import hybridpar_models
import keras
import tensorflow as tf

import hybridpar
from hybridpar.data.builders import clicks

hybridpar.log_to_stderr()  # show hybridpar's own lines: mode, sharding, checkpoints

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--no_steps_per_epoch", action="store_true")
parser.add_argument("--input", choices=["dataset", "fn", "generator", "arrays"], default="fn")
parser.add_argument("--validation", choices=["dataset", "arrays"], default="dataset",
                    help="validation_data as a tf.data dataset or as (x, y) arrays")
parser.add_argument("--shards", type=int, default=2)
parser.add_argument("--kill", default=None, help="task to SIGKILL in the first run, e.g. ps:1")
parser.add_argument("--kill_at", type=int, default=30, help="global step at which to kill")
parser.add_argument("--kill_at_epoch_start", action="store_true",
                    help="kill when the epoch that starts at --kill_at begins")
parser.add_argument("--await_restart", action="store_true",
                    help="after the kill, wait at the next epoch until the task runs again")
parser.add_argument("--term_at", type=int, default=0,
                    help="the chief sends itself SIGTERM after this global step (first run)")
parser.add_argument("--checkpoint_dir", default=None)
args = parser.parse_args()

TASK, RESTART = os.environ["HYBRIDPAR_TASK"], int(os.environ["HYBRIDPAR_RESTART"])
args.out.mkdir(parents=True, exist_ok=True)
(args.out / f"pid-{TASK}").write_text(str(os.getpid()))

NUM_USERS, NUM_ITEMS, BATCH = 2000, 4000, 64
features, labels = clicks.generate(4096)
features[:, 0] %= NUM_USERS
features[:, 1] %= NUM_ITEMS
NUM_WORKERS = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.shuffle(1024, seed=0).batch(BATCH)


def generator():
    yield from zip(features, labels, strict=True)


class StepCounting(keras.Model):
    """The recommender, counting on a ps variable which worker ran each step."""

    def __init__(self, inner: keras.Model, counts: tf.Variable) -> None:
        super().__init__()
        self.inner = inner
        self.counts = counts

    def call(self, x, training=False):
        return self.inner(x, training=training)

    def train_step(self, data):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        self.counts.assign_add(tf.one_hot(worker, NUM_WORKERS, dtype=tf.int64)[None])
        return super().train_step(data)


config = {
    "data_parallel": {"mode": "parameter_server"},
    "parameter_server": {"partitioner": {"kind": "fixed", "shards": args.shards}},
    "data": {"global_batch_size": BATCH},
}
if args.checkpoint_dir:
    config["checkpoint"] = {"dir": args.checkpoint_dir, "every_epochs": 1}
    config["evaluator"] = {"poll_seconds": 0.2}
with hybridpar.scope(config) as hs:
    counts = tf.Variable(tf.zeros([1, NUM_WORKERS], tf.int64), trainable=False)
    inner = hybridpar_models.get("wide_and_deep")(num_users=NUM_USERS, num_items=NUM_ITEMS)
    model = StepCounting(inner, counts)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


class Kill(keras.callbacks.Callback):
    """SIGKILLs one task at a global step of the first run; records the step counts."""

    killed_pid = None
    counts_by_epoch: list = []  # noqa: RUF012

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if args.kill_at_epoch_start and RESTART == 0 and epoch * args.steps == args.kill_at:
            self.kill()  # before any step of the epoch is scheduled: every one must fail
        pid_file = args.out / f"pid-{args.kill}"
        if self.killed_pid and args.await_restart:
            while int(pid_file.read_text()) == self.killed_pid:
                time.sleep(0.1)
            time.sleep(5)  # the restarted task starts its server; the coordinator reconnects
            self.killed_pid = None
        self.counts_by_epoch.append(counts.numpy()[0].tolist())

    def on_train_batch_end(self, batch, logs=None):
        if (args.kill and RESTART == 0 and not args.kill_at_epoch_start
                and self.epoch * args.steps + batch == args.kill_at):
            self.kill()
        if args.term_at and RESTART == 0 and self.epoch * args.steps + batch + 1 == args.term_at:
            print(f"sending SIGTERM to myself after scheduling step {args.term_at}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

    def kill(self):
        pid = int((args.out / f"pid-{args.kill}").read_text())
        print(f"killing {args.kill} (pid {pid}) at step {args.kill_at}", flush=True)
        os.kill(pid, signal.SIGKILL)
        self.killed_pid = pid


x = {
    "dataset": tf.data.Dataset.from_tensor_slices((features, labels)),
    "fn": dataset_fn,
    "generator": tf.data.Dataset.from_generator(
        generator, output_signature=(tf.TensorSpec([5], tf.int64), tf.TensorSpec([], tf.int64))),
    "arrays": features,
}[args.input]
validation = (features[:512], labels[:512])
if args.validation == "dataset":
    validation = tf.data.Dataset.from_tensor_slices(validation).batch(128)


def evaluate_validation() -> dict:
    if args.validation == "dataset":
        return model.evaluate(validation, return_dict=True, verbose=0)
    return model.evaluate(*validation, batch_size=128, return_dict=True, verbose=0)


history = model.fit(
    x,
    epochs=args.epochs,
    steps_per_epoch=None if args.no_steps_per_epoch else args.steps,
    validation_data=validation,
    callbacks=[Kill(), *hs.callbacks()],
    verbose=2,
)
if hs.is_evaluator:
    result = {"history": history.history, "epochs": history.epoch, "mode": hs.mode,
              "evaluation": evaluate_validation()}
    (args.out / f"evaluator-{RESTART}.json").write_text(json.dumps(result, indent=1))
    raise SystemExit(0)
table = inner.get_layer("item_embedding").embeddings
slots = [v for v in model.optimizer.variables if "item_embedding" in v.path]
result = {
    "restart": RESTART,
    "mode": hs.mode,
    "history": history.history,
    "epochs_run": history.epoch,
    "iterations": int(model.optimizer.iterations.numpy()),
    "steps_by_worker": counts.numpy()[0].tolist(),
    "steps_by_worker_at_epoch_begin": Kill.counts_by_epoch,
    "evaluation": model.evaluate(
        tf.data.Dataset.from_tensor_slices((features, labels)).batch(256), return_dict=True,
        verbose=0),
    "val_evaluation": evaluate_validation(),
    "predictions_shape": list(model.predict(features[:100], verbose=0).shape),
    "table_type": type(table.value).__name__,
    "table_shards": [[s.device, s.shape.as_list()]
                     for s in getattr(table.value, "variables", [table.value])],
    "slots": [[v.value.device, v.shape.as_list()] for v in slots],
}
(args.out / f"chief-{RESTART}.json").write_text(json.dumps(result, indent=1))
print("done", json.dumps({k: result[k] for k in ("iterations", "steps_by_worker")}))

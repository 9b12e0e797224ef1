"""A plain Keras `model.fit` script with hybridpar checkpoints, run by the checkpoint tests.

With --die_at STEP, task --die_task (on the first run only, HYBRIDPAR_RESTART=0) sends
itself --die_signal (KILL or TERM) right after that optimizer step. The script writes
its final weights, optimizer step, its own PowerSGD state (with --compression powersgd), the bytes
of optimizer state on its devices (--shard shards it, ZeRO stage 1) and the checkpoint it
resumed from to `<out>/<task>-run<restart>.json`. With --reshuffle every epoch has
another order; with --files N the examples are read from N TFRecord files, sharded over
the workers by FILE. With --validate, fit validates
on 96 held-out examples and the script evaluates on them after fit; on an evaluator task
(`launch --evaluator`) the same fit evaluates the chief's checkpoints instead of training.
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

GLOBAL_BATCH = 32


def examples() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(480, 12)).astype("float32")
    return x, (x[:, :3].sum(axis=1) > 0).astype("int32")


def dataset(reshuffle: bool = False) -> tf.data.Dataset:
    """480 examples, 15 global batches per epoch, the same order in every epoch (another
    order every epoch with ``reshuffle``)."""
    data = tf.data.Dataset.from_tensor_slices(examples())
    return data.shuffle(480, seed=3, reshuffle_each_iteration=reshuffle).batch(GLOBAL_BATCH)


def record_files(directory: pathlib.Path, files: int) -> list[str]:
    """The 480 examples in ``files`` TFRecord files (each task writes its own copy)."""
    directory.mkdir(parents=True, exist_ok=True)
    x, y = examples()
    paths = []
    for index, rows in enumerate(np.array_split(np.arange(len(x)), files)):
        path = str(directory / f"part-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for row in rows:
                writer.write(tf.io.serialize_tensor(
                    tf.concat([x[row], [float(y[row])]], 0)).numpy())
        paths.append(path)
    return paths


def file_dataset(paths: list[str], reshuffle: bool) -> tf.data.Dataset:
    """The examples read from files (sharded over workers by FILE), shuffled per file set."""
    data = tf.data.TFRecordDataset(paths).map(
        lambda record: tf.ensure_shape(tf.io.parse_tensor(record, tf.float32), [13]))
    data = data.map(lambda row: (row[:12], tf.cast(row[12], tf.int32)))
    return data.shuffle(480, seed=3, reshuffle_each_iteration=reshuffle).batch(GLOBAL_BATCH)


def held_out() -> tf.data.Dataset:
    """96 other examples of the same task, in 3 batches."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(96, 12)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


class Die(keras.callbacks.Callback):
    def __init__(self, step: int, signum: int) -> None:
        super().__init__()
        self.step, self.signum = step, signum

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            print(f"sending signal {self.signum} to myself after step {self.step}", flush=True)
            os.kill(os.getpid(), self.signum)


def compression_state(model: keras.Model, hs: hybridpar.HybridStrategy) -> list[dict]:
    """Per compressed gradient, this worker's replicas' PowerSGD error memories (by replica
    id in the sync group) and its Q factor: what this worker saves in a checkpoint."""
    compression = hs.state.compression
    powersgd = compression.state_for(model.optimizer) if compression is not None else None
    if not powersgd:
        return []
    return [{"errors": {str(replica): error.numpy().tolist() for replica, error in errors},
             "q": qs[0].numpy().tolist()}
            for errors, qs in zip(powersgd.local_errors(hs.strategy),
                                  powersgd.local_qs(hs.strategy), strict=True)]


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
}


def optimizer_bytes(model: keras.Model, hs: hybridpar.HybridStrategy) -> dict:
    """Bytes of optimizer state on each of this task's devices (sharded or not)."""
    from hybridpar.parallel import held_bytes

    variables = list(model.optimizer.variables)
    if hs.state.zero is not None:
        variables += list(hs.state.zero.state_for(model.optimizer).replica_variables())
    return held_bytes.variable_bytes_by_device(variables)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every_steps", type=int, default=10)
    parser.add_argument("--die_at", type=int, default=0)
    parser.add_argument("--die_task", default="worker:1")
    parser.add_argument("--die_signal", default="KILL", choices=["KILL", "TERM"])
    parser.add_argument("--compression", default="none",
                        choices=["none", "fp16", "bf16", "powersgd"])
    parser.add_argument("--rank", type=int, default=2, help="PowerSGD's rank")
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--shard", action="store_true", help="shard_optimizer_state: true")
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZERS))
    parser.add_argument("--no_callbacks_on", default="",
                        help="a task that passes no callbacks to fit (a broken script)")
    parser.add_argument("--reshuffle", action="store_true", help="another order every epoch")
    parser.add_argument("--files", type=int, default=0,
                        help="read the examples from this many TFRecord files, sharded by FILE")
    parser.add_argument("--no_save_iterator", action="store_true",
                        help="checkpoint.save_iterator: false")
    args = parser.parse_args()
    task = os.environ.get("HYBRIDPAR_TASK", "single")
    restart = int(os.environ.get("HYBRIDPAR_RESTART", "0"))

    if args.files:
        paths = record_files(pathlib.Path(args.out) / f"records-{task.replace(':', '-')}",
                             args.files)
        data = file_dataset(paths, args.reshuffle)
    else:
        data = dataset(args.reshuffle)
    keras.utils.set_random_seed(11)
    config = {
        "data": {"global_batch_size": GLOBAL_BATCH,
                 "shard_policy": "file" if args.files else "data"},
        # --ckpt DIR/{task} gives each task a directory of its own (not shared)
        "checkpoint": {"dir": args.ckpt.format(task=task.replace(":", "-")),
                       "every_steps": args.every_steps, "every_epochs": 1,
                       "keep": 3, "save_iterator": not args.no_save_iterator},
        "communication": {"timeout_seconds": 60, "compression": args.compression},
        "evaluator": {"poll_seconds": 0.2},
    }
    if args.shard:
        config["data_parallel"] = {"shard_optimizer_state": True}
    if args.compression == "powersgd":
        config["communication"]["powersgd"] = {"rank": args.rank, "min_elements": 0}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(2),
        ])
        model.compile(optimizer=OPTIMIZERS[args.optimizer](),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        callbacks = [] if task == args.no_callbacks_on else hs.callbacks()
    if args.die_at and task in (args.die_task, "single") and restart == 0:
        callbacks.append(Die(args.die_at, getattr(signal, f"SIG{args.die_signal}")))
    validation = held_out() if args.validate else None
    history = model.fit(data, epochs=args.epochs, verbose=2, shuffle=False, callbacks=callbacks,
                        validation_data=validation)
    restored = callbacks[0].restored if callbacks else None
    result = {
        "is_evaluator": hs.is_evaluator, "epochs": history.epoch,
        "evaluation": model.evaluate(validation, return_dict=True, verbose=0)
        if validation is not None else None,
        "task": task, "restart": restart, "mode": hs.mode, "num_replicas": hs.num_replicas,
        "topology": restored.manifest["topology"] if restored else None,
        "steps": int(model.optimizer.iterations.numpy()),
        "restored_step": restored.step if restored else None,
        "history": history.history,
        "weights": [w.tolist() for w in model.get_weights()],
        "compression_state": compression_state(model, hs),
        "optimizer_bytes": optimizer_bytes(model, hs),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task.replace(':', '-')}-run{restart}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

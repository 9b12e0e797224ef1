"""The `train_loop_per_worker` of the Ray Train tests: plain Keras 3 under `hybridpar.scope()`.

Ray imports this module on its workers (the session fixture puts this folder on
their PYTHONPATH); the tests also run `train_loop` in a plain process, without
Ray or TF_CONFIG, as the single-process reference. Each run writes its final
weights, optimizer step and the checkpoint it resumed from to
`<out>/<task>.json` (task: `worker-<index>`, or `single`).
"""

import json
import os
import pathlib
import signal
import threading


def dataset():
    """480 examples, 15 global batches of 32 per epoch, the same order in every epoch."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(7)
    x = rng.normal(size=(480, 12)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return data.shuffle(480, seed=3, reshuffle_each_iteration=False).batch(32)


def die_after(model, step: int, marker: str):
    """A callback that SIGKILLs this worker right after optimizer step ``step``."""
    import keras

    def maybe_die(batch, logs=None):
        if int(model.optimizer.iterations.numpy()) == step:
            pathlib.Path(marker).write_text(str(step))
            print(f"SIGKILLing myself after step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return keras.callbacks.LambdaCallback(on_train_batch_end=maybe_die)


def train_loop(config: dict) -> None:
    """Trains 3 epochs; ``config``: out, [checkpoint_dir, every_steps, stages, kill_at,
    kill_marker, report]."""
    import keras

    import hybridpar

    hybridpar.log_to_stderr()
    data = dataset()
    keras.utils.set_random_seed(11)
    settings = {"data": {"global_batch_size": 32, "shard_policy": "data"},
                "communication": {"timeout_seconds": 60}}
    if config.get("checkpoint_dir"):
        settings["checkpoint"] = {"dir": config["checkpoint_dir"], "every_epochs": 1, "keep": 3,
                                  "every_steps": config.get("every_steps")}
    if config.get("stages", 1) > 1:
        settings["model_parallel"] = {"stages": config["stages"],
                                      "placement": {"^hidden$": 0, "^head$": 1}}
    with hybridpar.scope(settings) as hs:
        model = keras.Sequential([
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="head"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        callbacks = hs.callbacks()
    task = f"worker-{hs.cluster.task_index}" if hs.cluster else "single"
    marker = config.get("kill_marker")
    if config.get("kill_at") and task == "worker-1" and not os.path.exists(marker):
        callbacks.append(die_after(model, config["kill_at"], marker))
    if config.get("report"):
        callbacks.append(hybridpar.ray_train.RayTrainReport(hs))
    history = model.fit(data, epochs=3, verbose=2, shuffle=False, callbacks=callbacks)
    restored = callbacks[0].restored if config.get("checkpoint_dir") else None
    result = {
        "task": task, "mode": hs.mode, "num_replicas": hs.num_replicas,
        "stages": hs.state.stages, "devices": list(hs.devices),
        "main_thread": threading.current_thread() is threading.main_thread(),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "steps": int(model.optimizer.iterations.numpy()),
        "restored_step": restored.step if restored else None,
        "history": history.history,
        "weights": [w.tolist() for w in model.get_weights()],
    }
    out = pathlib.Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task}.json").write_text(json.dumps(result))

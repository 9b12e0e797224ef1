"""A small training job with checkpoints, and a run of it killed half-way through a write.

``train`` is shared with tests/strategy/test_checkpoint_writer.py. Run as a
script,

    python checkpoint_writer_child.py CKPT_DIR

it trains with ``checkpoint.every_steps: 2``; from the second checkpoint on,
once the state files are written but before they are hashed and the
checkpoint is published, the process prints ``HALF-WRITTEN <writer thread>``
and waits, so the parent can SIGKILL it mid-write (a fault injected into
the write, in a real process).
"""

import pathlib
import sys
import threading

import keras
import numpy as np

import hybridpar
from hybridpar.checkpoint import storage


def train(directory: pathlib.Path, callbacks=()) -> tuple[keras.Model, object]:
    """8 steps of an MLP with ``PeriodicCheckpoint`` every 2 steps, keeping 3."""
    config = {"data_parallel": {"mode": "none"},
              "checkpoint": {"dir": str(directory), "every_steps": 2, "every_epochs": None,
                             "keep": 3}}
    keras.utils.set_random_seed(0)
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.Dense(1)])
        model.compile("adam", "mse")
        checkpoint = hs.callbacks()[0]
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
              callbacks=[checkpoint, *callbacks], shuffle=False)
    return model, checkpoint


def half_then_wait(original):
    checkpoints = []

    def sha256_of(path):
        partial = storage.name(str(path).rsplit("/", 1)[0])
        if partial not in checkpoints:
            checkpoints.append(partial)
        if len(checkpoints) == 1:
            return original(path)
        print(f"HALF-WRITTEN {threading.current_thread().name}", flush=True)
        threading.Event().wait()  # until killed

    return sha256_of


if __name__ == "__main__":
    hybridpar.testing.use_logical_cpus(1)
    storage.sha256_of = half_then_wait(storage.sha256_of)
    train(pathlib.Path(sys.argv[1]))

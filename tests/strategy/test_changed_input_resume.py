"""A resume whose input pipeline changed since the checkpoint (issue 36): the saved input
position is for the pipeline whose structural digest the checkpoint records
(hybridpar.data.pipeline_digest); another pipeline replays its epoch from the start, said
once, and a restored position with nothing after it raises, never an epoch of 0 steps."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import Crash

import hybridpar
from hybridpar.checkpoint import input_state, tensor_io
from hybridpar.errors import InputPositionError

pytestmark = pytest.mark.strategy

BATCH = 16
EXAMPLES = 1600  # 100 batches
CRASH = 30  # the checkpoint every 10 steps: the resume starts at step 30
CHANGED = "the training input's pipeline changed since the checkpoint"
RESTORED = "restored the training input's position from the checkpoint"


def features(examples: int = EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(EXAMPLES, 8)).astype("float32")[:examples],
            rng.normal(size=(EXAMPLES, 2)).astype("float32")[:examples])


def data(batch: int = BATCH, examples: int = EXAMPLES) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(features(examples)).batch(batch)


def scaled(factor: float) -> Callable[[], tf.data.Dataset]:
    return lambda: data().map(lambda x, y: (x * factor, y))


def write_records(directory: pathlib.Path, files: int = 4) -> list[str]:
    """The examples as TFRecord files of 400 each (25 batches a file)."""
    directory.mkdir(exist_ok=True)
    x, y = features()
    names = []
    for index in range(files):
        names.append(str(directory / f"part-{index}.tfrecord"))
        with tf.io.TFRecordWriter(names[-1]) as writer:
            for row in range(index * 400, (index + 1) * 400):
                writer.write(tf.io.serialize_tensor(np.concatenate([x[row], y[row]])).numpy())
    return names


def from_records(names: list[str]) -> tf.data.Dataset:
    def parse(record):
        row = tf.ensure_shape(tf.io.parse_tensor(record, tf.float32), [10])
        return row[:8], row[8:]

    return tf.data.TFRecordDataset(names).map(parse).batch(BATCH)


def train(directory: pathlib.Path, dataset: tf.data.Dataset, crash_at: int | None = None,
          **fit) -> keras.Model:
    keras.utils.set_random_seed(3)
    config = {"data_parallel": {"mode": "mirrored"},
              "checkpoint": {"dir": str(directory), "every_steps": 10}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    try:
        model.fit(dataset, callbacks=callbacks + extra, verbose=0, **{"epochs": 1, **fit})
    finally:  # the crash leaves the write in flight running, as at exit
        callbacks[0].writer.wait()
    return model


def crash(directory: pathlib.Path, dataset: tf.data.Dataset, **fit) -> None:
    """Trains until the crash after step 30 (the newest checkpoint is at 30)."""
    with pytest.raises(KeyboardInterrupt):
        train(directory, dataset, crash_at=CRASH, **fit)


def steps(model: keras.Model) -> int:
    return int(model.optimizer.iterations.numpy())


def said(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if text in r.getMessage() and r.levelno == level]


@pytest.mark.parametrize("changed, trained", [
    (lambda: data().take(70), 40),  # the reproduction
    (lambda: data(batch=20), 80 - CRASH),
    (scaled(2.0), 100 - CRASH),
], ids=["take", "batch size", "map"])
def test_a_changed_pipeline_replays_its_epoch_and_says_so_once(changed, trained, tmp_path,
                                                                 caplog):
    """The resumed epoch draws the 30 batches already trained from the new pipeline's start
    and trains the rest; restored, a take's position ran past its end (0 steps)."""
    original = scaled(1.0) if trained == 100 - CRASH else data
    crash(tmp_path, original())
    saved = tensor_io.BundleReader(tmp_path / f"ckpt-{CRASH:08d}").array(
        input_state.digest_key(0), "string")
    assert len(saved) == 64
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model = train(tmp_path, changed())
    warnings = said(caplog, CHANGED, logging.WARNING)
    assert len(warnings) == 1 and "replayed from its start" in warnings[0], caplog.text
    assert RESTORED not in caplog.text
    assert steps(model) == CRASH + trained


def test_the_same_pipeline_restores_its_position(tmp_path, caplog):
    crash(tmp_path, data())
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model = train(tmp_path, data())
    assert said(caplog, RESTORED) and not said(caplog, CHANGED, logging.WARNING)
    assert steps(model) == 100


def test_another_file_list_replays_its_epoch(tmp_path, caplog):
    names = write_records(tmp_path / "records")
    crash(tmp_path / "ckpt", from_records(names))
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model = train(tmp_path / "ckpt", from_records(names[:3]))
    assert len(said(caplog, CHANGED, logging.WARNING)) == 1
    assert steps(model) == CRASH + 75 - CRASH  # the 3 files' 75 batches, 30 drawn again


def without_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the checkpoints written from now on hold their input's state without its
    digest, as hybridpar wrote them before it saved digests."""
    capture = input_state.InputSaver.capture

    def capture_state_only(saver, iterator, worker):
        pieces, record = capture(saver, iterator, worker)
        return [p for p in pieces if p.key != input_state.digest_key(worker)], record

    monkeypatch.setattr(input_state.InputSaver, "capture", capture_state_only)


def test_a_state_without_a_digest_restores_as_before(tmp_path, caplog, monkeypatch):
    without_digests(monkeypatch)
    crash(tmp_path, data())
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model = train(tmp_path, data())
    assert said(caplog, RESTORED)
    assert steps(model) == 100


def test_a_state_that_does_not_fit_is_replayed_from_the_start(tmp_path, caplog,
                                                               monkeypatch):
    """Without a digest, the state is tried: TensorFlow refuses it for a pipeline of other
    stages, which leaves the iterator ended; it is put back at its start and replayed."""
    without_digests(monkeypatch)
    crash(tmp_path, data())
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        model = train(tmp_path, data().take(70))
    assert said(caplog, "the saved state does not fit this input's pipeline")
    assert steps(model) == 70


def unbuffered(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` without the prefetch TensorFlow injects after a batch: its buffer, part of
    the saved state, would yield 2 batches of the saved pipeline after any restore."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def test_a_restored_position_with_nothing_after_it_raises(tmp_path, monkeypatch):
    """Without a digest, the state of take(100) restores into take(30) (the same stages):
    at batch 30 of an epoch of steps_per_epoch=50 it has nothing left."""
    without_digests(monkeypatch)
    crash(tmp_path, unbuffered(data().take(100)), epochs=2, steps_per_epoch=50)
    monkeypatch.undo()
    with pytest.raises(InputPositionError, match=(
            r"yields fewer batches than the checkpoint's position: the checkpoint saved it "
            r"at batch 30 of epoch 1 \(optimizer step 30\), of an epoch of 50 steps, and the "
            r"restored iterator has no batch after it .* checkpoint.save_iterator: false")):
        train(tmp_path, unbuffered(data().take(30)), epochs=2, steps_per_epoch=50)
    # Raised at the resumed fit's first step, before it trained or saved: step 30 stays
    # the newest checkpoint.
    assert max(p.name for p in tmp_path.glob("ckpt-*")) == f"ckpt-{CRASH:08d}"


def test_an_input_of_unknown_length_is_not_guarded(tmp_path, monkeypatch):
    """The same restore where nobody knows the epoch's length (a filter, no
    steps_per_epoch): no error; the epoch ends at once and Keras says the input ran out,
    as it does at the end of any such epoch. The digest is what tells these apart."""
    def unknown(count: int) -> tf.data.Dataset:
        return unbuffered(data().take(count).filter(lambda x, y: True))

    without_digests(monkeypatch)
    crash(tmp_path, unknown(100))
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="ran out of data"):
        model = train(tmp_path, unknown(30))
    assert steps(model) == CRASH

"""Checkpoints written in the background: off the step loop, one at a time, failures reported.

Faults are injected into hybridpar's own writer (``tensor_io.write``, which
has every task write its state files); training, variables and files are real.
"""

import errno
import itertools
import logging
import pathlib
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
from checkpoint_writer_child import train  # beside this file

import hybridpar
from hybridpar.checkpoint import files, tensor_io
from hybridpar.checkpoint.manifest import INDEX_FILE

pytestmark = pytest.mark.strategy

CHILD = pathlib.Path(__file__).with_name("checkpoint_writer_child.py")


class Events:
    """What the writer thread and the step loop did, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def add(self, kind: str, what: object) -> None:
        with self.lock:
            self.log.append((kind, what))


def test_writes_run_in_the_background_one_at_a_time(tmp_path, monkeypatch):
    events = Events()
    first_write_may_end = threading.Event()
    original = tensor_io.write
    calls = []

    def recorded(partial, pieces, written=()):
        name = threading.current_thread().name
        events.add("write-start", name)
        calls.append(name)
        if len(calls) == 1:
            first_write_may_end.wait(timeout=120)  # the step loop goes on meanwhile
        entries = original(partial, pieces, written)
        events.add("write-end", name)
        return entries

    monkeypatch.setattr(tensor_io, "write", recorded)

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            events.add("step", int(self.model.optimizer.iterations.numpy()))
            if int(self.model.optimizer.iterations.numpy()) == 3:
                first_write_may_end.set()

    model, _ = train(tmp_path, callbacks=[Steps()])
    log = events.log
    writes = [what for kind, what in log if kind == "write-start"]
    assert writes == [f"hybridpar-checkpoint-ckpt-{s:08d}" for s in (2, 4, 6, 8)]
    assert all(name != threading.main_thread().name for name in writes)
    # Step 3 ran while checkpoint 2 was being written: the save did not block the loop.
    assert log.index(("step", 3)) < log.index(("write-end", writes[0]))
    # One write in flight: each ends before the next starts.
    for earlier, later in itertools.pairwise(writes):
        assert log.index(("write-end", earlier)) < log.index(("write-start", later))
    # The end of fit waited for the last write.
    assert [p.name for p in files.list_checkpoints(tmp_path)] == [
        "ckpt-00000004", "ckpt-00000006", "ckpt-00000008"]
    for path in files.list_checkpoints(tmp_path):
        files.verify(path)
    restored = keras.models.clone_model(model)
    restored.compile("adam", "mse")
    hybridpar.checkpoint.restore(restored, tmp_path)
    for a, b in zip(restored.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_failed_background_write_is_reported_and_keeps_the_previous(
    tmp_path, monkeypatch, caplog
):
    original = tensor_io.write
    calls = []

    def disk_full_on_the_second(partial, pieces, written=()):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            original(partial, pieces[:1], written)
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(partial, pieces, written)

    monkeypatch.setattr(tensor_io, "write", disk_full_on_the_second)
    expected = (r"ckpt-00000004 .* failed in the background \(OSError: .*No space left on "
                r"device\).*newest complete one is ckpt-00000002")
    with caplog.at_level(logging.ERROR, logger="hybridpar"), pytest.raises(
        hybridpar.CheckpointWriteError, match=expected
    ):
        train(tmp_path)
    assert calls[1] != threading.main_thread().name
    assert "ckpt-00000004" in caplog.text and "No space left" in caplog.text  # logged at once
    assert [p.name for p in files.list_checkpoints(tmp_path)] == ["ckpt-00000002"]
    files.verify(tmp_path / "ckpt-00000002")
    assert not list(tmp_path.glob(".partial-*"))


@pytest.mark.slow
def test_a_kill_during_the_write_leaves_the_previous_checkpoint(tmp_path):
    child = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while not line.startswith("HALF-WRITTEN"):
            line = child.stdout.readline()
            assert line or child.poll() is None, "the child ended before the write"
    finally:
        child.kill()
        child.wait(timeout=60)
    assert line.strip() == "HALF-WRITTEN hybridpar-checkpoint-ckpt-00000004"
    partial = list(tmp_path.glob(".partial-ckpt-00000004-*"))
    assert len(partial) == 1 and (partial[0] / INDEX_FILE).stat().st_size > 0
    found = hybridpar.checkpoint.latest(tmp_path)
    assert found.path.name == "ckpt-00000002" and not found.skipped
    _, checkpoint = train(tmp_path)  # the next run removes the partial and resumes
    assert checkpoint.restored.step == 2
    assert not list(tmp_path.glob(".partial-*"))

"""The evaluator's view of a checkpoint directory, on checkpoints of plain numpy arrays."""

import logging
import os

import numpy as np
import pytest

from hybridpar.checkpoint import end_record, files, npz, publication, watch
from hybridpar.errors import CheckpointDamagedError, ConfigError


def write(directory, step, epoch=0, batch=0):
    manifest = {"step": step, "created": 0.0, "variables": {},
                "data": {"epoch": epoch, "batch": batch, "iterator_position": batch,
                         "iterator_persists": False}}
    return npz.write(directory, {"model/00000": np.full(3, float(step))}, manifest)


class Chief:
    """Writes checkpoints between the watcher's polls, as the chief does meanwhile."""

    def __init__(self, directory, plan):
        self.directory, self.plan, self.polls = directory, list(plan), 0

    def sleep(self, seconds):
        self.polls += 1
        if self.plan:
            self.plan.pop(0)(self.directory)


def steps(events):
    return [(event.kind, event.step) for event in events]


def test_every_new_checkpoint_in_order_until_the_recorded_end(tmp_path):
    def epoch(step):
        return lambda d: write(d, step, epoch=step // 10)

    def end(d):
        write(d, 30, epoch=3)
        end_record.write(d, step=30, epoch=3, epochs=3)

    chief = Chief(tmp_path, [lambda d: None, epoch(10), epoch(20), end])
    watcher = watch.CheckpointWatcher(tmp_path, sleep=chief.sleep)
    events = list(watcher.events(epochs=3))
    assert steps(events) == [("checkpoint", 10), ("checkpoint", 20), ("checkpoint", 30)]
    np.testing.assert_array_equal(events[-1].arrays["model/00000"], [30.0, 30.0, 30.0])
    assert [watch.epoch_index(e.manifest) for e in events] == [0, 1, 2]
    assert watch.position(events[0].manifest) == "end of epoch 1"


def test_an_end_record_after_the_last_checkpoint_was_read_ends_the_watch(tmp_path):
    write(tmp_path, 10, epoch=1)
    chief = Chief(tmp_path, [lambda d: end_record.write(d, step=10, epoch=1, epochs=1)])
    assert steps(watch.CheckpointWatcher(tmp_path, sleep=chief.sleep).events(1)) == [
        ("checkpoint", 10)]
    assert chief.polls == 1


def test_checkpoints_deleted_before_they_are_read_and_damaged_ones_are_reported(tmp_path,
                                                                                  monkeypatch):
    for step in (10, 20, 30):
        write(tmp_path, step)
    state = tmp_path / "ckpt-00000020" / "state.npz"
    state.write_bytes(state.read_bytes()[:50])
    end_record.write(tmp_path, step=30, epoch=1, epochs=1)
    listing = files.list_checkpoints(tmp_path)  # listed, then keep-N deletes the oldest
    publication.prune(tmp_path, keep=2)
    monkeypatch.setattr(files, "list_checkpoints", lambda directory: listing)
    events = list(watch.CheckpointWatcher(tmp_path).events(1))
    assert steps(events) == [("deleted", 10), ("damaged", 20), ("checkpoint", 30)]
    assert "has 50 bytes, the manifest says" in events[1].reason


def test_an_end_record_of_other_epochs_is_a_previous_run(tmp_path, caplog):
    write(tmp_path, 10, epoch=1)
    end_record.write(tmp_path, step=10, epoch=1, epochs=1)
    clock = iter(range(0, 1000, 5))
    watcher = watch.CheckpointWatcher(tmp_path, timeout_seconds=12, clock=lambda: next(clock),
                                      sleep=lambda s: None)
    with caplog.at_level(logging.INFO, "hybridpar"), pytest.raises(
            TimeoutError, match=r"No new checkpoint appeared in .* for 12 s "
                                r"\(evaluator.timeout_seconds; the newest seen: ckpt-00000010\)"):
        list(watcher.events(epochs=3))
    assert "says fit(epochs=1) ended at step 10; this fit has epochs=3" in caplog.text


def test_newest_skips_damaged_checkpoints_and_waits_for_a_first_one(tmp_path, caplog):
    chief = Chief(tmp_path, [lambda d: write(d, 4), lambda d: write(d, 8)])
    watcher = watch.CheckpointWatcher(tmp_path, sleep=chief.sleep)
    with caplog.at_level(logging.INFO, "hybridpar"):
        assert watcher.newest().step == 4
    assert "evaluator waiting for the first checkpoint" in caplog.text
    write(tmp_path, 8)
    (tmp_path / "ckpt-00000008" / "manifest.json").unlink()
    assert watcher.newest().step == 4
    assert "checkpoint ckpt-00000008 is damaged" in caplog.text


def test_load_reads_what_it_checked(tmp_path):
    path = write(tmp_path, 5)
    manifest, arrays = npz.load(path)
    assert manifest["step"] == 5 and list(arrays) == ["model/00000"]
    (path / "state.npz").unlink()
    with pytest.raises(CheckpointDamagedError, match="state.npz is missing"):
        npz.load(path)
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        npz.load(tmp_path / "ckpt-00000099")


def test_the_end_record_is_replaced_atomically_and_removed(tmp_path):
    assert end_record.read(tmp_path) is None
    end_record.write(tmp_path, step=12, epoch=2, epochs=2)
    end_record.write(tmp_path, step=24, epoch=4, epochs=4)
    record = end_record.read(tmp_path)
    assert (record["step"], record["checkpoint"], record["epochs"]) == (24, "ckpt-00000024", 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training-end.json"]
    end_record.remove(tmp_path)
    end_record.remove(tmp_path)
    assert end_record.read(tmp_path) is None


def test_an_unreadable_checkpoint_dir_is_refused_before_waiting(tmp_path):
    watch.check_readable(tmp_path / "not-yet")  # the chief creates it
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"checkpoint.dir='.*file', but it is not a directory"):
        watch.check_readable(afile)
    with pytest.raises(ConfigError, match=r"checkpoint.dir='.*file/ckpt', but .*file is not a "
                                          r"directory"):
        watch.check_readable(afile / "ckpt")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_a_checkpoint_dir_without_read_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o300)
    with pytest.raises(ConfigError, match="this process may not list and read it"):
        watch.check_readable(locked)

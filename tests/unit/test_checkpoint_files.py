"""hybridpar.checkpoint's file format and rules, on plain numpy arrays (no TensorFlow)."""

import hashlib
import json

import numpy as np
import pytest

from hybridpar.checkpoint import files, manifest, npz, publication, storage
from hybridpar.errors import CheckpointDamagedError


def write(directory, step, **data):
    position = {"epoch": 0, "batch": 0, "iterator_position": 0, "iterator_persists": False}
    record = {"step": step, "data": {**position, **data}, "variables": {}}
    return npz.write(directory, {"model/00000": np.arange(4.0) + step}, record)


def test_write_is_a_complete_directory_named_by_step(tmp_path):
    path = write(tmp_path, 7)
    assert path.name == "ckpt-00000007" and files.step_of(path) == 7
    written = files.verify(path)
    assert written["format"] == manifest.FORMAT
    assert written["files"]["state.npz"]["bytes"] == (path / "state.npz").stat().st_size
    np.testing.assert_array_equal(npz.read_arrays(path)["model/00000"], np.arange(4.0) + 7)
    assert not list(tmp_path.glob(".partial-*"))
    assert write(tmp_path, 7) == path  # an existing step is kept as it is


def test_listing_prune_and_partials(tmp_path):
    for step in (3, 12, 100):
        write(tmp_path, step)
    (tmp_path / ".partial-ckpt-00000200-1").mkdir()
    (tmp_path / ".zero-ckpt-00000200-worker-1").mkdir()  # shards no chief merged
    (tmp_path / "notes.txt").write_text("")
    assert [p.name for p in files.list_checkpoints(tmp_path)] == [
        "ckpt-00000003", "ckpt-00000012", "ckpt-00000100"]
    assert [p.name for p in publication.prune(tmp_path, keep=2)] == ["ckpt-00000003"]
    assert [p.name for p in files.list_checkpoints(tmp_path)] == [
        "ckpt-00000012", "ckpt-00000100"]
    publication.remove_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000012", "ckpt-00000100", "notes.txt"]
    assert files.list_checkpoints(tmp_path / "missing") == []


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "manifest.json").unlink(), "has no manifest.json"),
    (lambda p: (p / "manifest.json").write_text("{"), "manifest.json is unreadable"),
    (lambda p: (p / "manifest.json").write_text('{"format": "x"}'), "is not a hybridpar"),
    (lambda p: (p / "state.npz").unlink(), "state.npz is missing"),
    (lambda p: (p / "state.npz").write_bytes(b"x"), r"has 1 bytes, the manifest says \d+"),
])
def test_damage_is_named_and_latest_falls_back(tmp_path, damage, message):
    write(tmp_path, 1)
    damage(write(tmp_path, 2))
    with pytest.raises(CheckpointDamagedError, match=message):
        files.verify(tmp_path / "ckpt-00000002")
    found = files.latest(tmp_path)
    assert found.step == 1 and found.skipped[0][0].name == "ckpt-00000002"


def test_a_shallow_check_hashes_the_index_and_sizes_the_data_files(tmp_path):
    """Choosing without reading every tensor (one process, the ps) still hashes the index, a
    few bytes per tensor; a data file is checked by its size here and by TensorFlow's
    CRC32C as the restore reads it."""
    path = tmp_path / "ckpt-00000001"
    path.mkdir()
    index, data = path / "state.index", path / "state.data-00000-of-00001"
    index.write_bytes(b"index bytes")
    data.write_bytes(b"data bytes")
    entries = {index.name: {"bytes": 11, "sha256": hashlib.sha256(b"index bytes").hexdigest()},
               data.name: {"bytes": 10, "checksum": manifest.CRC32C}}
    (path / "manifest.json").write_text(json.dumps(
        {"format": manifest.FORMAT_V2, "step": 1, "files": entries}))
    data.write_bytes(b"DATA bytes")  # the same size: left to the CRC32C as it is read
    assert files.verify(path, deep=False)["step"] == 1
    index.write_bytes(b"INDEX bytes")
    with pytest.raises(CheckpointDamagedError, match=r"state.index has SHA-256 .* the "
                                                     r"manifest says"):
        files.verify(path, deep=False)


def test_latest_of_nothing_is_none_and_of_only_damage_an_error(tmp_path):
    assert files.latest(tmp_path) is None
    (write(tmp_path, 5) / "state.npz").write_bytes(b"")
    with pytest.raises(CheckpointDamagedError, match="every checkpoint in .* is damaged"):
        files.latest(tmp_path)


def test_mismatches_are_matched_by_position_and_name_both_sides():
    spec = manifest.variable_spec
    saved = [spec("m/dense/kernel", (8, 16), "float32"), spec("m/dense/bias", (16,), "float32")]
    same_shapes = [spec("m_1/dense_1/kernel", (8, 16), "float32"),
                   spec("m_1/dense_1/bias", (16,), "float32")]
    assert manifest.mismatches(saved, same_shapes) == []
    other = [spec("m/dense/kernel", (8, 32), "float32")]
    assert manifest.mismatches(saved, other) == [
        "m/dense/kernel (8, 32) float32 in this model, m/dense/kernel (8, 16) float32 in the "
        "checkpoint",
        "m/dense/bias (16,) float32: in the checkpoint, not in this model",
    ]
    assert manifest.mismatches([], other) == ["m/dense/kernel (8, 32) float32: not in the "
                                                "checkpoint"]
    message = manifest.mismatch_message(storage.Path("c"), "model", ["a"] * 10)
    assert "10 variable(s) do not match" in message and "... and 2 more" in message


@pytest.mark.parametrize("data, steps, expected", [
    ({"epoch": 2, "batch": 5, "iterator_position": 5, "iterator_persists": False}, 13, (2, 5, 0)),
    ({"epoch": 2, "batch": 13, "iterator_position": 13, "iterator_persists": False}, 13,
     (3, 0, 0)),
    ({"epoch": 3, "batch": 0, "iterator_position": 0, "iterator_persists": False}, None,
     (3, 0, 0)),
    ({"epoch": 2, "batch": 4, "iterator_position": 24, "iterator_persists": True}, 10,
     (2, 4, 20)),
])
def test_resume_plan(data, steps, expected):
    assert manifest.resume_plan({"data": data}, steps) == expected


def test_describe_topology():
    assert manifest.describe_topology(
        {"mode": "multi_worker", "num_workers": 2, "num_replicas": 4}
    ) == "multi_worker, 2 worker(s) x 2 replica(s)"


def test_manifest_is_plain_json(tmp_path):
    path = write(tmp_path, 1, epoch=3)
    assert json.loads((path / "manifest.json").read_text())["data"]["epoch"] == 3


@pytest.mark.parametrize("data, steps, expected", [
    ({"epoch": 1, "batch": 0}, 20, (1, 0, "at the start of epoch 2")),
    ({"epoch": 1, "batch": 10, "steps_per_epoch": 20}, 20,
     (1, 10, "inside epoch 2, after its first 10 step(s); each worker's input starts again")),
    ({"epoch": 1, "batch": 10}, 20, (1, 10, "inside epoch 2, after its first 10 step(s)")),
    ({"epoch": 1, "batch": 10, "steps_per_epoch": 20}, 30,
     (2, 0, "at the start of epoch 3, not inside epoch 2 after its step 10: it was written "
            "with steps_per_epoch=20 and this fit has 30")),
    ({"epoch": 0, "batch": 25}, 20, (1, 0, "at the start of epoch 2, not inside epoch 1 after "
                                           "its step 25: its epoch had ended")),
])
def test_where_parameter_server_training_resumes(data, steps, expected):
    epoch, batch, where = manifest.asynchronous_resume({"data": data}, steps)
    assert (epoch, batch) == expected[:2]
    assert where.startswith(expected[2])

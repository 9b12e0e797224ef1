"""The checkpoint format: TensorFlow's tensor bundle, re-cut slices, any filesystem, old
checkpoints, export to a Keras weights file."""

import json
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_checkpoints_in_one_process import EPOCHS, build, max_diff, train  # beside this file

import hybridpar
from hybridpar import ConfigError
from hybridpar.checkpoint import files, layout, model_state, npz, storage, tensor_io
from hybridpar.checkpoint.manifest import FORMAT, variable_spec
from hybridpar.errors import CheckpointMismatchError

pytestmark = pytest.mark.strategy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rows(devices: list[str], table: np.ndarray, sizes: list[int]) -> list[tf.Variable]:
    """``table`` split into row shards of ``sizes``, one per device."""
    parts, offset = [], 0
    for device, size in zip(devices, sizes, strict=True):
        with tf.device(device):
            parts.append(tf.Variable(table[offset:offset + size]))
        offset += size
    return parts


def test_a_table_written_as_two_slices_is_read_into_three_and_whole(tmp_path):
    table = np.arange(7 * 3, dtype="float32").reshape(7, 3)
    two = rows(["/device:CPU:0", "/device:CPU:1"], table, [4, 3])
    logical = layout.Logical("t", (7, 3), "float32", layout._row_parts(two))
    pieces = tensor_io.snapshot({"model": [logical]})
    assert [p.spec for p in pieces] == ["7 3 0,4:-", "7 3 4,3:-"]
    two[0].assign(tf.zeros((4, 3)))  # after the snapshot: the files hold the values before
    storage.makedirs(tmp_path / "p")
    entries = tensor_io.write(tmp_path / "p", pieces)
    assert sorted(entries) == ["state.data-00000-of-00001", "state.index"]  # one task here
    three = rows(["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"], np.zeros_like(table),
                 [3, 2, 2])
    target = layout.Logical("t", (7, 3), "float32", layout._row_parts(three))
    reader = tensor_io.BundleReader(tmp_path / "p")
    for part in target.parts:
        part.variable.assign(reader.read("model/00000", target, part))
    np.testing.assert_array_equal(np.concatenate([v.numpy() for v in three]), table)
    whole = layout.Logical("t", (7, 3), "float32", [layout.Part(tf.Variable(table * 0))])
    np.testing.assert_array_equal(reader.read("model/00000", whole, whole.parts[0]), table)


def test_training_on_a_ram_filesystem_resumes_like_an_uninterrupted_run(tmp_path):
    reference, _, _ = train(tmp_path / "reference")
    directory = f"ram://hybridpar-test-{os.getpid()}/ckpt"
    with pytest.raises(KeyboardInterrupt):
        train(directory, crash_at=19)
    assert [storage.name(p) for p in files.list_checkpoints(directory)] == [
        "ckpt-00000013", "ckpt-00000016"]
    assert not os.path.exists("ram:")  # nothing went to a local folder named ram:
    resumed, _, callback = train(directory)
    assert callback.restored.step == 16 and callback.restored.path == f"{directory}/ckpt-00000016"
    assert max_diff(resumed, reference) <= 1e-5
    assert sorted(tf.io.gfile.listdir(f"{directory}/ckpt-00000036")) == [
        "manifest.json", "state.data-00000-of-00001", "state.index"]


def test_an_unknown_url_scheme_fails_before_training_naming_the_value():
    with pytest.raises(ConfigError, match=r"checkpoint.dir='nosuch://bucket/ckpt': TensorFlow "
                       r"has no filesystem for the URL scheme 'nosuch' \(it has: .*ram"):
        train("nosuch://bucket/ckpt")


def old_format_checkpoint(model: keras.Model, directory) -> None:
    """What hybridpar wrote before format 2: one state.npz of host arrays, in Keras's order."""
    arrays, specs = {}, {}
    for group, variables in (("model", model.variables), ("optimizer", model.optimizer.variables),
                             ("metrics", model.metrics_variables)):
        specs[group] = [variable_spec(v.path, v.shape, v.dtype) for v in variables]
        for index, variable in enumerate(variables):
            arrays[f"{group}/{index:05d}"] = np.asarray(variable.numpy())
    data = {"epoch": EPOCHS, "batch": 0, "iterator_position": 0, "iterator_persists": False}
    step = int(model.optimizer.iterations.numpy())
    npz.write(directory, arrays, {"step": step, "data": data, "variables": specs})


def test_a_checkpoint_of_the_old_format_restores_with_a_note(tmp_path, caplog):
    trained, _, _ = train(tmp_path / "new")
    old_format_checkpoint(trained, tmp_path / "old")
    assert files.read_manifest(tmp_path / "old" / "ckpt-00000039")["format"] == FORMAT
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}):
        model = build()
    with caplog.at_level(logging.INFO, logger="hybridpar"):
        hybridpar.checkpoint.restore(model, tmp_path / "old")
    assert "ckpt-00000039 is in an earlier hybridpar's format (hybridpar-checkpoint/1" in (
        caplog.text)
    assert max_diff(model, trained) == 0.0


def test_export_writes_a_weights_file_plain_keras_loads(tmp_path):
    trained, _, callback = train(tmp_path / "ckpt")
    newest = callback.checkpoints()[-1]
    target = tmp_path / "model.weights.h5"
    command = [sys.executable, "-m", "hybridpar.cli", "checkpoint", "export", str(newest),
               "--to", str(target)]
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["weights"] == len(trained.weights)
    plain = build()  # no hybridpar scope: what a Keras user has
    plain.optimizer.build(plain.trainable_variables)
    plain.load_weights(str(target))
    for ours, theirs in zip(plain.get_weights(), trained.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(plain.optimizer.variables[-1], trained.optimizer.variables[-1])
    assert int(plain.optimizer.iterations.numpy()) == EPOCHS * 13
    # The Python equivalent, into a model of another architecture: refused by name.
    with pytest.raises(CheckpointMismatchError, match=r"hidden/kernel \(8, 32\) float32 in "
                       r"this model"):
        hybridpar.checkpoint.export_weights(newest, build(hidden=32), tmp_path / "x.weights.h5")
    with pytest.raises(ConfigError, match=r"must end in .weights.h5.*Received: --to 'w.h5'"):
        hybridpar.checkpoint.export_weights(newest, trained, "w.h5")


def test_a_snapshot_on_a_non_writing_worker_reads_only_the_metrics(tmp_path):
    model = build()
    model.fit(np.ones((16, 8), "float32"), np.ones((16, 2), "float32"), verbose=0)
    pieces, manifest = model_state.snapshot(model, {"epoch": 0}, writes=False)
    assert pieces == [] and "model_config" not in manifest
    written, manifest = model_state.snapshot(model, {"epoch": 0})
    assert len(written) == sum(len(manifest["variables"][g])
                               for g in ("model", "optimizer", "metrics"))
    assert json.loads(manifest["model_config"])["class_name"] == "Sequential"


def test_a_flipped_byte_is_caught_by_tensorflows_crc_as_the_values_are_read(tmp_path):
    """What a ps finds when it reads its own rows (restores there check sizes, not SHA-256)."""
    _, _, callback = train(tmp_path / "ckpt")
    newest = callback.checkpoints()[-1]
    data = newest / "state.data-00000-of-00001"
    damaged = bytearray(data.read_bytes())
    damaged[8] ^= 0xFF  # inside the first tensor: the hidden kernel
    data.write_bytes(bytes(damaged))
    manifest = files.verify(newest, deep=False)  # the size is still right
    model = build()
    model_state.ensure_built(model)
    with pytest.raises(hybridpar.errors.CheckpointDamagedError,
                       match=r"ckpt-00000039: model/00000 cannot be read \(.*"):
        model_state.apply(model, newest, manifest, model_state.reader(newest, manifest))

"""Checkpoints from config in one process: manifest, keep-N, resume, damage, topology."""

import hashlib
import json
import logging
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import Crash

import hybridpar
from hybridpar import ConfigError
from hybridpar.errors import CheckpointDamagedError, CheckpointMismatchError

pytestmark = pytest.mark.strategy

EPOCHS = 3
BATCH = 16


def dataset() -> tf.data.Dataset:
    """200 examples, 13 batches per epoch (the last one partial), the same order every epoch."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype("float32")
    y = rng.normal(size=(200, 2)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return data.shuffle(200, seed=1, reshuffle_each_iteration=False).batch(BATCH)


def build(hidden: int = 16, steps_per_execution: int = 1) -> keras.Model:
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(hidden, activation="relu", name="hidden"),
        keras.layers.Dropout(0.2, seed=4),
        keras.layers.Dense(2, name="out"),
    ])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"],
                  steps_per_execution=steps_per_execution)
    return model


def config(directory, mode="none", **checkpoint) -> dict:
    return {"data_parallel": {"mode": mode}, "data": {"global_batch_size": BATCH},
            "checkpoint": {"dir": str(directory), "every_steps": 4, "keep": 2, **checkpoint}}


def train(directory, mode="none", crash_at=None, hidden=16, steps_per_execution=1,
          **checkpoint):
    keras.utils.set_random_seed(3)
    with hybridpar.scope(config(directory, mode, **checkpoint)) as hs:
        model = build(hidden, steps_per_execution)
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    try:
        history = model.fit(dataset(), epochs=EPOCHS, callbacks=callbacks + extra,
                            shuffle=False, verbose=0)
    finally:  # a crash inside this process leaves the write in flight running: as at exit
        callbacks[0].writer.wait()
    return model, history, callbacks[0]


def max_diff(a: keras.Model, b: keras.Model) -> float:
    pairs = zip(a.get_weights() + [v.numpy() for v in a.optimizer.variables],
                b.get_weights() + [v.numpy() for v in b.optimizer.variables], strict=True)
    return max(float(np.max(np.abs(x - y))) for x, y in pairs)


def test_periodic_checkpoints_keep_the_newest_with_a_manifest(tmp_path):
    model, _, callback = train(tmp_path / "ckpt", every_epochs=None)
    steps = EPOCHS * 13
    assert int(model.optimizer.iterations.numpy()) == steps
    assert [p.name for p in callback.checkpoints()] == ["ckpt-00000032", "ckpt-00000036"]
    newest = callback.checkpoints()[-1]
    assert sorted(p.name for p in newest.iterdir()) == [
        "manifest.json", "state.data-00000-of-00001", "state.index"]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["step"] == 36
    fingerprint = manifest["data"].pop("input_state")["fingerprint"]
    assert manifest["data"] == {"epoch": 2, "batch": 10, "iterator_position": 10,
                                "iterator_persists": False}
    assert fingerprint.startswith("1 worker(s) x 1 replica(s), data sharding")
    assert manifest["topology"] == {"mode": "none", "num_workers": 1, "num_replicas": 1,
                                    "devices": ["/device:CPU:0"], "global_batch_size": BATCH}
    assert manifest["config"]["checkpoint"]["every_steps"] == 4
    assert manifest["format"] == "hybridpar-checkpoint/2"
    data, index = (manifest["files"][name] for name in ("state.data-00000-of-00001",
                                                         "state.index"))
    # The data file is covered by TensorFlow's CRC32C of each tensor, kept in the index,
    # and the index by its SHA-256: nothing is read back after the write.
    assert data == {"bytes": (newest / "state.data-00000-of-00001").stat().st_size,
                    "checksum": "tensorflow-crc32c-per-tensor", "task": "localhost:0"}
    assert index["sha256"] == hashlib.sha256((newest / "state.index").read_bytes()).hexdigest()
    # TensorFlow's own reader reads it: every variable whole, under its hybridpar key.
    shapes = tf.train.load_checkpoint(str(newest / "state")).get_variable_to_shape_map()
    assert shapes["model/00000"] == list(model.variables[0].shape)
    # ... and the input iterator's state (hybridpar.checkpoint.input_state) and its
    # pipeline's digest, strings.
    assert shapes["input/00000"] == shapes["input/00000/digest"] == []
    assert len(shapes) == 2 + sum(len(manifest["variables"][g]) for g in ("model", "optimizer",
                                                                           "metrics"))
    assert [v["path"] for v in manifest["variables"]["model"]] == [
        v.path for v in model.variables]
    assert manifest["variables"]["optimizer"][0]["path"].endswith("iteration")


@pytest.mark.parametrize("mode, steps_per_execution, every_steps, saved_at, batch", [
    ("none", 1, 4, 16, 3),
    ("mirrored", 1, 4, 16, 3),
    ("none", 2, 5, 15, 2),  # steps 13, 15, 17, ... in epoch 2
])
def test_an_interrupted_run_ends_like_an_uninterrupted_one(
    mode, steps_per_execution, every_steps, saved_at, batch, tmp_path
):
    settings = {"steps_per_execution": steps_per_execution, "every_steps": every_steps}
    reference, reference_history, _ = train(tmp_path / "reference", mode, **settings)
    with pytest.raises(KeyboardInterrupt):  # in epoch 2 (of 13 batches each)
        train(tmp_path / "resumed", mode, crash_at=19, **settings)
    resumed, history, callback = train(tmp_path / "resumed", mode, **settings)
    assert callback.restored.step == saved_at
    assert callback.restored.manifest["data"]["epoch"] == 1
    assert callback.restored.manifest["data"]["batch"] == batch
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 13
    assert max_diff(resumed, reference) <= 1e-5
    # The resumed epoch's metrics include the batches trained before the crash.
    np.testing.assert_allclose(history.history["loss"], reference_history.history["loss"][1:],
                               rtol=1e-5)


def test_upstream_backup_and_restore_replays_the_interrupted_epoch(tmp_path):
    """Why hybridpar does not use Keras's BackupAndRestore: it resumes at the epoch only."""
    def run(crash_at=None):
        keras.utils.set_random_seed(3)
        model = build()
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=4)
        extra = [Crash(crash_at)] if crash_at else []
        model.fit(dataset(), epochs=EPOCHS, callbacks=[backup, *extra], shuffle=False,
                  verbose=0)
        return model

    with pytest.raises(KeyboardInterrupt):
        run(crash_at=20)  # Keras saved after step 20: epoch 2, batch 7
    resumed = run()
    # The 7 batches of epoch 2 trained before the backup are trained again.
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 13 + 7


def test_resume_at_an_epoch_boundary(tmp_path):
    reference, _, _ = train(tmp_path / "reference", every_steps=None, every_epochs=1)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", every_steps=None, every_epochs=1, crash_at=30)
    resumed, history, callback = train(tmp_path / "resumed", every_steps=None, every_epochs=1)
    assert callback.restored.manifest["data"]["epoch"] == 2
    assert len(history.history["loss"]) == 1
    assert max_diff(resumed, reference) <= 1e-5


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=19)
    latest = tmp_path / "ckpt" / "ckpt-00000016"
    state = latest / "state.data-00000-of-00001"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated
    (tmp_path / "ckpt" / ".partial-ckpt-00000020-999").mkdir()  # a write that never finished
    reference, _, _ = train(tmp_path / "reference")
    with caplog.at_level(logging.WARNING, logger="hybridpar"):
        resumed, _, callback = train(tmp_path / "ckpt")
    assert callback.restored.step == 13  # saved at the end of epoch 1
    assert callback.restored.skipped[0][0] == latest
    assert "checkpoint ckpt-00000016 is damaged" in caplog.text
    assert "(truncated?)" in caplog.text
    assert "using checkpoint ckpt-00000013 (step 13) instead of the damaged ckpt-00000016" in (
        caplog.text)
    assert max_diff(resumed, reference) <= 1e-5
    assert not list((tmp_path / "ckpt").glob(".partial-*"))


def crash_and_flip_a_byte(directory, name: str):
    """Trains to a crash after step 9 and flips a byte of file ``name`` of the newest
    checkpoint (step 8; its size stays right). Returns that file."""
    with pytest.raises(KeyboardInterrupt):
        train(directory, crash_at=9)
    state = directory / "ckpt-00000008" / name
    data = bytearray(state.read_bytes())
    data[-200] ^= 0xFF
    state.write_bytes(bytes(data))
    return state


@pytest.mark.parametrize("name", ["state.data-00000-of-00001", "state.index"])
def test_a_corrupted_byte_is_found_by_the_checksum(tmp_path, name):
    state = crash_and_flip_a_byte(tmp_path / "ckpt", name)
    found = {"state.data-00000-of-00001": r"state.data-00000-of-00001 fails TensorFlow's CRC32C "
                                          r"check of (input|optimizer)/\d+ \(.*Checksum does not "
                                          r"match",
             "state.index": r"state.index has SHA-256 .* the manifest says"}[name]
    with pytest.raises(CheckpointDamagedError, match=found):
        hybridpar.checkpoint.verify(state.parent)
    assert hybridpar.checkpoint.latest(tmp_path / "ckpt").step == 4


@pytest.mark.parametrize("name", ["state.data-00000-of-00001", "state.index"])
def test_a_flipped_byte_found_as_the_resume_reads_falls_back_to_the_previous(
    tmp_path, name, caplog
):
    """One process reads the checkpoint once: no tensor is read ahead to check it. The
    sizes still match; the index's SHA-256 finds a byte of the index when the checkpoint is
    chosen, TensorFlow's CRC32C one of the data file (here in the input's saved position)
    as it is read, and the previous checkpoint is restored over what was read."""
    state = crash_and_flip_a_byte(tmp_path / "ckpt", name)
    reference, _, _ = train(tmp_path / "reference")
    with caplog.at_level(logging.WARNING, logger="hybridpar"):
        resumed, _, callback = train(tmp_path / "ckpt")
    assert callback.restored.step == 4
    assert callback.restored.skipped[0][0] == state.parent
    found = {"state.data-00000-of-00001": r"ckpt-00000008 is damaged: .*ckpt-00000008: "
                                          r"input/00000 cannot be read",
             "state.index": r"ckpt-00000008 is damaged: .*state.index has SHA-256"}[name]
    assert re.search(found, caplog.text), caplog.text
    assert max_diff(resumed, reference) <= 1e-5


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=5)
    (tmp_path / "ckpt" / "ckpt-00000004" / "manifest.json").unlink()
    with pytest.raises(CheckpointDamagedError, match=r"every checkpoint in .* is damaged "
                       r"\(.*ckpt-00000004 has no manifest.json\)"):
        train(tmp_path / "ckpt")


def test_a_checkpoint_of_another_model_names_the_variables(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=5)
    with pytest.raises(CheckpointMismatchError, match=(
        r"written by a different model: 3 variable\(s\) do not match: "
        r"sequential(_\d+)?/hidden/kernel \(8, 32\) float32 in this model, "
        r"sequential(_\d+)?/hidden/kernel \(8, 16\) float32 in the checkpoint; "
        r"sequential(_\d+)?/hidden/bias \(32,\) float32 in this model")):
        train(tmp_path / "ckpt", hidden=32)


def test_unwritable_checkpoint_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"checkpoint.dir='.*a_file/ckpt' is not a writable "
                       r"directory \(Not a directory\)"):
        train(blocker / "ckpt")


@pytest.mark.parametrize("source, target", [("mirrored", "none"), ("none", "mirrored")])
def test_a_checkpoint_restores_in_another_topology(source, target, tmp_path):
    trained, _, _ = train(tmp_path / "ckpt", source)
    with hybridpar.scope({"data_parallel": {"mode": target}}) as hs:
        model = build()
    found = hybridpar.checkpoint.restore(model, tmp_path / "ckpt")
    assert found.manifest["topology"]["mode"] == source
    assert hs.num_replicas == (4 if target == "mirrored" else 1)
    assert max_diff(model, trained) == 0.0
    x = np.ones((8, 8), "float32")
    np.testing.assert_allclose(model.predict(x, verbose=0), trained.predict(x, verbose=0),
                               atol=1e-6)
    # Training continues from the restored step in the new topology.
    model.fit(dataset().take(2), epochs=1, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * 13 + 2


def test_restore_needs_a_checkpoint_and_a_built_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No checkpoint in .*empty \(expected "
                       r"directories named ckpt-<step>\)"):
        hybridpar.checkpoint.restore(build(), tmp_path / "empty")
    train(tmp_path / "ckpt")
    unbuilt = keras.Sequential([keras.layers.Dense(2)], name="unbuilt")
    with pytest.raises(ConfigError, match="Model 'unbuilt' has no variables yet"):
        hybridpar.checkpoint.restore(unbuilt, tmp_path / "ckpt")
    other_optimizer = build()
    other_optimizer.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    with pytest.raises(CheckpointMismatchError, match="written by a different optimizer"):
        hybridpar.checkpoint.restore(other_optimizer, tmp_path / "ckpt")
    hybridpar.checkpoint.restore(other_optimizer, tmp_path / "ckpt", optimizer=False)


@pytest.mark.parametrize("every_steps, every_epochs, crash_at, saved", [
    (4, None, 14, {"epoch": 2, "batch": 2, "iterator_position": 12}),
    (None, 1, 7, {"epoch": 1, "batch": 0, "iterator_position": 5}),
])
def test_resume_inside_a_repeated_dataset_with_steps_per_epoch(
    every_steps, every_epochs, crash_at, saved, tmp_path
):
    """The iterator spans epochs: the batches of earlier epochs are skipped too."""
    def run(directory, crash_at=None):
        keras.utils.set_random_seed(3)
        checkpoint = {"every_steps": every_steps, "every_epochs": every_epochs}
        with hybridpar.scope(config(directory, **checkpoint)) as hs:
            model = build()
            callbacks = hs.callbacks()
        extra = [Crash(crash_at)] if crash_at else []
        try:
            model.fit(dataset().repeat(), epochs=4, steps_per_epoch=5, shuffle=False,
                      verbose=0, callbacks=callbacks + extra)
        finally:  # the crash leaves the write in flight running, as at exit (else the next
            callbacks[0].writer.wait()  # run's chief removes it as a partial write)
        return model, callbacks[0]

    reference, _ = run(tmp_path / "reference")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed", crash_at=crash_at)
    resumed, callback = run(tmp_path / "resumed")
    data = dict(callback.restored.manifest["data"])
    assert "fingerprint" in data.pop("input_state")
    assert data == {**saved, "iterator_persists": True}
    assert int(resumed.optimizer.iterations.numpy()) == 20
    assert max_diff(resumed, reference) <= 1e-5


def test_a_data_files_sha256_in_an_earlier_manifest_is_still_checked(tmp_path):
    """Format-2 manifests written before the CRC32C checksums held each data file's SHA-256."""
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=9)
    newest = tmp_path / "ckpt" / "ckpt-00000008"
    manifest = json.loads((newest / "manifest.json").read_text())
    data = manifest["files"]["state.data-00000-of-00001"]
    del data["checksum"]
    data["sha256"] = hashlib.sha256(
        (newest / "state.data-00000-of-00001").read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    assert hybridpar.checkpoint.verify(newest)["step"] == 8
    data["sha256"] = "0" * 64
    (newest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointDamagedError, match=r"state.data-00000-of-00001 has SHA-256 "):
        hybridpar.checkpoint.verify(newest)

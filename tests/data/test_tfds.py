"""Tests for TFDS loading (`hybridpar.data`) and the embedded digits data set."""

from __future__ import annotations

import hashlib
import logging
import os
import socket

import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

from hybridpar import data
from hybridpar.data.builders import digits

TINY = "hybridpar_tiny_test_set"


class HybridparTinyTestSet(tfds.core.GeneratorBasedBuilder):
    """A non-embedded builder: `load_tfds` must read it but never prepare it."""

    VERSION = tfds.core.Version("0.1.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:  # Same TFDS 4.9.10 workaround as digits.
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {"x": np.float32, "y": tfds.features.ClassLabel(num_classes=2)}
            ),
            supervised_keys=("x", "y"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(10):
            yield i, {"x": float(i), "y": i % 2}


@pytest.fixture(scope="module", autouse=True)
def no_network():
    """Fails any Python-level connection attempt: everything must be offline."""

    def refuse(self, address):
        raise AssertionError(f"network access attempted: {address!r}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        yield


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory, no_network):
    """A data_dir where `load_tfds` prepared hybridpar_digits on first use."""
    data_dir = tmp_path_factory.mktemp("tfds")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("hybridpar.data")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        data.load_tfds("hybridpar_digits", "train", data_dir)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    messages = [r.getMessage() for r in records]
    assert len(messages) == 1 and "hybridpar_digits" in messages[0], messages
    return data_dir


def _ids(ds) -> list[int]:
    return [int(ex["id"]) for ex in ds.as_numpy_iterator()]


def test_embedded_split_sizes_and_ids(digits_dir):
    train = _ids(data.load_tfds("hybridpar_digits", "train", digits_dir))
    test = _ids(data.load_tfds("hybridpar_digits", "test", digits_dir))
    assert len(train) == digits.TRAIN_SIZE == 1500
    assert len(test) == 297
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert sorted(train + test) == list(range(1797))
    assert set(train) == set(range(1500))  # Documented split: first 1500 rows.


def test_embedded_shard_files(digits_dir):
    train = data.dataset_files("hybridpar_digits", "train", digits_dir)
    test = data.dataset_files("hybridpar_digits", "test", digits_dir)
    assert len(train) == 8 and len(test) == 2
    assert all(os.path.isfile(f) for f in train + test)
    assert train[0].endswith("-train.tfrecord-00000-of-00008")
    assert test[-1].endswith("-test.tfrecord-00001-of-00002")


def test_embedded_features(digits_dir):
    ds = data.load_tfds("hybridpar_digits", "train", digits_dir, as_supervised=True)
    images, labels = [], []
    for image, label in ds.as_numpy_iterator():
        images.append(image)
        labels.append(label)
    images = np.stack(images)
    assert images.dtype == np.uint8 and images.shape == (1500, 8, 8, 1)
    assert images.min() == 0 and images.max() == 255
    # Rescaled from the source's 0..16: every value is round(k * 255 / 16).
    allowed = {round(k * 255 / 16) for k in range(17)}
    assert set(np.unique(images).tolist()) <= allowed
    assert sorted(set(np.asarray(labels).tolist())) == list(range(10))


def test_features_match_the_source_file(digits_dir):
    pixels, labels = digits.source_arrays()
    for ex in data.load_tfds("hybridpar_digits", "test", digits_dir).as_numpy_iterator():
        i = int(ex["id"])
        assert ex["label"] == labels[i]
        np.testing.assert_array_equal(ex["image"][..., 0], np.round(pixels[i] * 255 / 16))


def test_the_shipped_source_is_load_digits():
    """The file is scikit-learn's ``load_digits`` data, as fingerprinted from scikit-learn 1.9.1."""
    pixels, labels = digits.source_arrays()
    assert pixels.shape == (1797, 8, 8) and pixels.min() == 0 and pixels.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert hashlib.sha256(pixels.astype(np.uint8).tobytes()).hexdigest() == (
        "8f26b2bd9d135c256808f68f14fdabddde6d9c7f869ae419704b051f0f14b3b3")
    assert hashlib.sha256(labels.tobytes()).hexdigest() == (
        "a3c91c262eddcf7ba8f0e37507c30284493c9b20412ffe4af30d536401f7ba21")


def test_second_load_does_not_rebuild(digits_dir, caplog):
    root = digits_dir / "hybridpar_digits"
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    with caplog.at_level(logging.INFO, logger="hybridpar.data"):
        data.load_tfds("hybridpar_digits", "test", digits_dir)
        data.dataset_files("hybridpar_digits", "train", digits_dir)
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert after == before
    assert not [r for r in caplog.records if r.name == "hybridpar.data"]
    from tensorflow_datasets.core.utils import tqdm_utils

    assert tqdm_utils._active  # Progress bars restored after preparing.


def test_absent_tfds_dataset_is_not_downloaded(tmp_path):
    with pytest.raises(data.DatasetNotFoundError) as info:
        data.load_tfds("mnist", "train", tmp_path)
    message = str(info.value)
    assert "mnist" in message and str(tmp_path) in message and "tfds build" in message
    assert "'train'" in message
    assert isinstance(info.value, FileNotFoundError)
    assert not (tmp_path / "mnist").exists()


def test_unknown_name(tmp_path):
    with pytest.raises(data.DatasetNotFoundError, match="Unknown data set 'mnistt'") as info:
        data.load_tfds("mnistt", "train", tmp_path)
    assert "hybridpar_digits" in str(info.value)
    assert "Did you mean 'mnist'" in str(info.value)


def test_bad_split_lists_available(digits_dir):
    with pytest.raises(ValueError, match="Available splits: test, train"):
        data.load_tfds("hybridpar_digits", "validation", digits_dir)
    with pytest.raises(ValueError, match="expected one of: test, train"):
        data.dataset_files("hybridpar_digits", "train[:10%]", digits_dir)


def test_split_slicing(digits_dir):
    ds = data.load_tfds("hybridpar_digits", "test[:10]", digits_dir)
    assert len(_ids(ds)) == 10


def test_non_embedded_dataset_present_in_data_dir(tmp_path):
    empty = tmp_path / "empty"
    with pytest.raises(data.DatasetNotFoundError, match=TINY):
        data.load_tfds(TINY, "train", empty)  # Only embedded sets are prepared.
    assert not (empty / TINY).exists()

    prepared = tmp_path / "prepared"
    tfds.builder(TINY, data_dir=prepared).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
    pairs = list(data.load_tfds(TINY, "train", prepared, as_supervised=True).as_numpy_iterator())
    assert sorted((float(x), int(y)) for x, y in pairs) == [(i, i % 2) for i in range(10)]
    assert len(data.dataset_files(TINY, "train", prepared)) == 1

"""The ``hybridpar_digits`` data set: the UCI 8x8 optical digits as TFDS.

Importing this module registers the builder with TensorFlow Datasets, so
``tfds.builder("hybridpar_digits", data_dir=...)`` and
`hybridpar.data.load_tfds` find it by name.

The source is ``digits.csv.gz`` beside this module: scikit-learn's copy of the
UCI "Optical Recognition of Handwritten Digits" test set (the file behind
`sklearn.datasets.load_digits`, copied verbatim from scikit-learn 1.9.1,
BSD-3-Clause; the data: Alpaydin and Kaynak, UCI, CC BY 4.0). It ships with
hybridpar, so preparing the data set reads no network and no manual
directory, and hybridpar does not depend on scikit-learn (whose presence makes
every ``import keras`` load it, with SciPy: about 2 s of CPU per process).

Layout (stable, part of version 1.0.0):

* ``id``: int64, the example's row in the file (`load_digits` order), 0..1796.
* ``image``: uint8, shape (8, 8, 1), ``round(pixel * 255 / 16)``.
* ``label``: `ClassLabel` with the 10 classes "0".."9".
* ``train``: rows 0..1499 (1500 examples), written as 8 TFRecord shards.
* ``test``: rows 1500..1796 (297 examples), written as 2 TFRecord shards.

Within a split, TFDS orders examples by a hash of ``id`` (deterministic, the
same on every machine), so every shard holds a mix of classes.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

NUM_EXAMPLES = 1797
TRAIN_SIZE = 1500
#: TFRecord shards written per split. A caller's explicit
#: ``DownloadConfig(num_shards=N)`` overrides this for every split.
NUM_SHARDS = {"train": 8, "test": 2}

SOURCE = Path(__file__).with_name("digits.csv.gz")
_SOURCE_MAX_PIXEL = 16


def source_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The source file as ``load_digits`` reads it: float (1797, 8, 8) in 0..16, int64 labels."""
    with gzip.open(SOURCE) as rows:
        table = np.loadtxt(rows, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def _load_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(images, labels)``: uint8 (1797, 8, 8, 1) and int64 (1797,)."""
    pixels, labels = source_arrays()
    images = np.round(pixels * (255.0 / _SOURCE_MAX_PIXEL))
    return np.clip(images, 0, 255).astype(np.uint8)[..., np.newaxis], labels


class HybridparDigits(tfds.core.GeneratorBasedBuilder):
    """The UCI 8x8 handwritten digits, generated locally from the shipped file (no download)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Initial release."}

    # TFDS 4.9.10 derives `code_path` via `importlib_resources` (a backport it
    # only declares for Python < 3.9), which fails for builders living in a
    # package. This builder has no checksums or metadata files beside it, so the
    # plain module path is all TFDS needs.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "8x8 grey-scale handwritten digits: scikit-learn's copy of the UCI "
                "optical digits data, shipped with hybridpar (1797 examples). train: "
                "rows 0..1499 in 8 shards; test: rows 1500..1796 in 2 shards."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "id": np.int64,
                    "image": tfds.features.Image(shape=(8, 8, 1), dtype=np.uint8),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
            citation=(
                "@misc{alpaydin1998optdigits, author={Alpaydin, E. and Kaynak, C.}, "
                "title={Optical Recognition of Handwritten Digits}, year={1998}, "
                "publisher={UCI Machine Learning Repository}}"
            ),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # Everything comes from the file shipped beside this module.
        images, labels = _load_arrays()
        bounds = {"train": (0, TRAIN_SIZE), "test": (TRAIN_SIZE, NUM_EXAMPLES)}
        only = getattr(self, "_hybridpar_only_split", None)
        return {
            split: self._generate_examples(images, labels, start, stop)
            for split, (start, stop) in bounds.items()
            if only is None or split == only
        }

    def _generate_examples(
        self, images: np.ndarray, labels: np.ndarray, start: int, stop: int
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for index in range(start, stop):
            yield index, {"id": index, "image": images[index], "label": int(labels[index])}

    def _download_and_prepare(
        self,
        dl_manager: tfds.download.DownloadManager,
        download_config: tfds.download.DownloadConfig,
    ) -> None:
        # TFDS applies one `ShardConfig` (from `DownloadConfig.num_shards`) to all
        # splits (dataset_builder.py, GeneratorBasedBuilder._generate_splits). To
        # give each split its own shard count, generate one split per call.
        if download_config.max_examples_per_split == 0:
            return
        split_infos = []
        for split, num_shards in NUM_SHARDS.items():
            config = download_config
            if download_config.num_shards is None:
                config = download_config.replace(num_shards=num_shards)
            self._hybridpar_only_split = split
            try:
                split_infos.extend(self._generate_splits(dl_manager, config))
            finally:
                del self._hybridpar_only_split
        self.info.set_splits(tfds.core.SplitDict(split_infos))

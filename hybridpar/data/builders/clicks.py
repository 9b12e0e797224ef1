"""The ``hybridpar_clicks`` data set: synthetic recommender clicks as TFDS.

Importing this module registers the builder with TensorFlow Datasets. The
examples are drawn from a fixed hidden model with a fixed seed, so every
machine generates the same bytes; nothing is downloaded.

Layout (stable, part of version 1.0.0):

* ``id``: int64, the example's index.
* ``features``: int64, shape (5,): ``[user, item, user_segment,
  item_category, hour]`` with ``user < NUM_USERS``, ``item < NUM_ITEMS``,
  ``user_segment < NUM_SEGMENTS``, ``item_category < NUM_CATEGORIES``,
  ``hour < 24``.
* ``label``: `ClassLabel` "no_click"/"click".
* ``train``: 20000 examples; ``test``: 4000 examples.

Users and items are drawn with Zipf(1.3) popularity (a few recur often, most
rarely, as in real logs), their ids spread over the tables by a fixed
permutation. The hidden model: users and items have 4-dimensional latent vectors (items
share most of theirs with their category, users with their segment); the
click logit is their dot product plus a segment x category affinity and an
hour-of-day term, plus logistic noise. A model that learns user and item
embeddings and the segment x category cross can beat the majority class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

NUM_USERS = 50_000
NUM_ITEMS = 100_000
NUM_SEGMENTS = 16
NUM_CATEGORIES = 64
SIZES = {"train": 20_000, "test": 4_000}
_SEED = 20261130
_LATENT = 4
_ZIPF = 1.3


def generate(num_examples: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(features, labels)`` of examples ``offset .. offset + num_examples - 1``.

    Deterministic: the hidden model comes from a fixed seed, and each block
    of 1000 examples from a generator seeded with the seed and the block.
    """
    hidden = np.random.default_rng(_SEED)
    segment_of_user = hidden.integers(0, NUM_SEGMENTS, NUM_USERS)
    category_of_item = hidden.integers(0, NUM_CATEGORIES, NUM_ITEMS)
    segment_vectors = hidden.normal(size=(NUM_SEGMENTS, _LATENT))
    category_vectors = hidden.normal(size=(NUM_CATEGORIES, _LATENT))
    affinity = hidden.normal(scale=1.5, size=(NUM_SEGMENTS, NUM_CATEGORIES))
    user_noise = hidden.normal(scale=0.7, size=(NUM_USERS, _LATENT))
    item_noise = hidden.normal(scale=0.7, size=(NUM_ITEMS, _LATENT))
    hour_effect = np.sin(np.arange(24) / 24 * 2 * np.pi)
    user_ids = hidden.permutation(NUM_USERS)  # popularity rank -> id, spread over the table
    item_ids = hidden.permutation(NUM_ITEMS)
    features = np.empty((num_examples, 5), np.int64)
    labels = np.empty((num_examples,), np.int64)
    for start in range(0, num_examples, 1000):
        stop = min(start + 1000, num_examples)
        rng = np.random.default_rng([_SEED, (offset + start) // 1000])
        count = stop - start
        users = user_ids[np.minimum(rng.zipf(_ZIPF, count) - 1, NUM_USERS - 1)]
        items = item_ids[np.minimum(rng.zipf(_ZIPF, count) - 1, NUM_ITEMS - 1)]
        hours = rng.integers(0, 24, count)
        segments, categories = segment_of_user[users], category_of_item[items]
        user_vectors = segment_vectors[segments] + user_noise[users]
        item_vectors = category_vectors[categories] + item_noise[items]
        logit = (
            np.sum(user_vectors * item_vectors, axis=1)
            + affinity[segments, categories]
            + hour_effect[hours]
            + rng.logistic(size=count)
        )
        features[start:stop] = np.stack([users, items, segments, categories, hours], axis=1)
        labels[start:stop] = (logit > 0).astype(np.int64)
    return features, labels


class HybridparClicks(tfds.core.GeneratorBasedBuilder):
    """Synthetic user x item clicks for the wide-and-deep recommender (no download)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Initial release."}

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:  # see HybridparDigits.code_path
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                f"Synthetic clicks of {NUM_USERS} users on {NUM_ITEMS} items from a fixed "
                "hidden latent model (seeded, generated locally)."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "id": np.int64,
                    "features": tfds.features.Tensor(shape=(5,), dtype=np.int64),
                    "label": tfds.features.ClassLabel(names=["no_click", "click"]),
                }
            ),
            supervised_keys=("features", "label"),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # Everything is generated here.
        offsets = {"train": 0, "test": SIZES["train"]}
        return {split: self._generate_examples(SIZES[split], offsets[split]) for split in SIZES}

    def _generate_examples(self, size: int, offset: int) -> Iterator[tuple[int, dict[str, Any]]]:
        features, labels = generate(size, offset)
        for i in range(size):
            yield offset + i, {"id": offset + i, "features": features[i], "label": int(labels[i])}

"""Input data: TFDS loading that never downloads, and what hybridpar reads of pipelines.

``tfds`` loads prepared TensorFlow Datasets splits by name from a ``data_dir``
and generates the embedded data sets (``builders``) locally; ``inspect``
reads a ``tf.data`` graph (batched? how many files? Python ops?) without
reading data; ``sharding`` applies ``data.shard_policy`` across workers.

Importing this package is cheap: TensorFlow Datasets is imported on first
use.
"""

from hybridpar.data.tfds import (
    EMBEDDED_DATASETS,
    DatasetNotFoundError,
    dataset_files,
    dataset_info,
    load_tfds,
)

__all__ = [
    "EMBEDDED_DATASETS",
    "DatasetNotFoundError",
    "dataset_files",
    "dataset_info",
    "load_tfds",
]

"""Input data: TFDS loading that never downloads, and what hybridpar reads of pipelines.

``tfds`` loads prepared TensorFlow Datasets splits by name from a ``data_dir``
and generates the embedded data sets (``builders``) locally; ``inspect``
reads what a ``tf.data`` pipeline is (batched? how many files? Python ops?)
from its structure (``dataset_structure``) without reading or copying data;
``pipeline_digest`` names a pipeline by that structure, so a checkpoint's saved
input position is restored only into the pipeline it was saved from;
``sharding`` applies ``data.shard_policy`` across workers.

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

"""The time of ``hybridpar.data.pipeline_digest.digest``, which each resumable ``fit`` takes
once: on in-memory data, large and small, and on a file pipeline.

- in memory: ``from_tensor_slices`` of ``--gigabytes`` of float32 features (and labels),
  shuffled, mapped, batched, prefetched, as ``fit(dataset)`` of a NumPy array reads;
- files: ``--files`` TFRecord files (written to a temporary directory), listed,
  interleaved, parsed with ``tf.io.parse_single_example``, shuffled, batched.

Each pipeline is built once and digested ``--repeats`` times (a digest caches nothing);
the median is reported, with the peak resident memory before and after the large
in-memory digests (after building the pipeline, which copies the arrays into tensors).
``digest_size_ratio`` is the large in-memory pipeline's median over that of the same
pipeline on ``SMALL_GIGABYTES`` (target <= 1.5: the digest does not read the data).

    python benchmarks/pipeline_digest.py [--gigabytes 2.2] [--files 64] [--repeats 5]

The last lines are ``digest_seconds_files=``, ``digest_seconds_in_memory=`` and
``digest_size_ratio=``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

FEATURES = 256  # float32 columns of the in-memory data
SMALL_GIGABYTES = 0.3  # the small in-memory pipeline: its labels (1.2 MB) are sampled too


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=2.2)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.gigabytes <= 0 or args.files < 1 or args.repeats < 1:
        parser.error("--gigabytes must be > 0, --files and --repeats >= 1")
    return args


def rows_for(gigabytes: float) -> int:
    """Rows of ``FEATURES`` float32 columns making ``gigabytes`` (10^9 bytes)."""
    return max(int(gigabytes * 1e9 / (FEATURES * 4)), 1)


def in_memory(features: Any, labels: Any) -> Any:
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((features, labels))
    return (data.shuffle(1024, seed=1).map(lambda x, y: (x * 2.0 - 1.0, y))
            .batch(64).prefetch(2))


def in_memory_of(gigabytes: float) -> Any:
    import numpy as np

    rows = rows_for(gigabytes)
    return in_memory(np.ones((rows, FEATURES), "float32"), np.zeros((rows,), "float32"))


def write_files(directory: str, count: int) -> str:
    """``count`` TFRecord files of 16 examples each; returns their glob pattern."""
    import tensorflow as tf

    for index in range(count):
        with tf.io.TFRecordWriter(f"{directory}/part-{index:05d}.tfrecord") as writer:
            for row in range(16):
                feature = tf.train.Feature(float_list=tf.train.FloatList(value=[row] * 8))
                example = tf.train.Example(features=tf.train.Features(feature={"x": feature}))
                writer.write(example.SerializeToString())
    return f"{directory}/part-*.tfrecord"


def from_files(pattern: str) -> Any:
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([8], tf.float32)}
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4,
                               num_parallel_calls=tf.data.AUTOTUNE)
    parsed = records.map(lambda r: tf.io.parse_single_example(r, spec)["x"],
                         num_parallel_calls=tf.data.AUTOTUNE)
    return parsed.shuffle(256, seed=1).batch(32).prefetch(tf.data.AUTOTUNE)


def median_seconds(dataset: Any, repeats: int) -> float:
    from hybridpar.data import pipeline_digest

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pipeline_digest.digest(dataset)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def resident_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        pattern = write_files(directory, args.files)
        files = median_seconds(from_files(pattern), args.repeats)
    small = median_seconds(in_memory_of(SMALL_GIGABYTES), args.repeats)
    dataset = in_memory_of(args.gigabytes)
    before = resident_mb()
    memory = median_seconds(dataset, args.repeats)
    print(f"in-memory data: {args.gigabytes:.2f} GB against {SMALL_GIGABYTES} GB; peak "
          f"resident memory {before:.0f} MB before the large digests, {resident_mb():.0f} "
          "MB after")
    print(f"digest_seconds_files={files:.4f}")
    print(f"digest_seconds_in_memory={memory:.4f}")
    print(f"digest_size_ratio={memory / small:.3f}")


if __name__ == "__main__":
    main()

"""hybridpar.data.pipeline_digest: the same in every process for the same pipeline, another
for another pipeline, and a few blocks read of large in-memory data."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops

from hybridpar.data import pipeline_digest
from hybridpar.data.pipeline_digest import digest

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]

# One module's source, run here and in fresh processes: pipelines with a shuffle, a map
# calling a tf.function and capturing a tensor, files, an interleave.
PIPELINES = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf

    SCALE = tf.constant([2.0, 3.0])

    @tf.function
    def shifted(a):
        return a + 1.0

    def in_memory(rows=1600, batch=16, offset=0.0):
        x = np.random.default_rng(0).normal(size=(rows, 2)).astype("float32")
        data = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
        return (data.shuffle(100, seed=1).map(lambda a, b: (shifted(a) * SCALE + offset, b))
                .batch(batch).prefetch(2))

    def write_files(directory, count=4):
        names = [f"{directory}/part-{i}.tfrecord" for i in range(count)]
        for name in names:
            with tf.io.TFRecordWriter(name) as writer:
                writer.write(b"record")
        return names

    def from_files(names):
        files = tf.data.Dataset.from_tensor_slices(names)
        records = files.interleave(tf.data.TFRecordDataset, cycle_length=2)
        return records.map(tf.strings.length).batch(4)
''')


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory) -> dict[str, Any]:
    """The module's functions, its folder (``directory``) and its files (``names``)."""
    source = tmp_path_factory.mktemp("digest") / "pipelines.py"
    source.write_text(PIPELINES)
    spec = importlib.util.spec_from_file_location("digest_pipelines", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**vars(module), "directory": source.parent,
            "names": module.write_files(source.parent)}


def map_function_name(dataset: tf.data.Dataset) -> str:
    """The traced name of the map of ``in_memory`` (under its batch and prefetch)."""
    return dataset._input_dataset._input_dataset._map_func.function.name


def test_the_same_pipeline_built_again_has_the_same_digest(pipelines):
    """Built twice, its functions get other names (``__inference_..._<n>``)."""
    first, second = pipelines["in_memory"](), pipelines["in_memory"]()
    assert map_function_name(first) != map_function_name(second)
    assert digest(first) == digest(second)
    names = pipelines["names"]
    assert digest(pipelines["from_files"](names)) == digest(pipelines["from_files"](names))


def test_what_changes_the_pipeline_changes_the_digest(pipelines):
    in_memory, from_files, names = (pipelines[k] for k in ("in_memory", "from_files", "names"))
    base = digest(in_memory())
    changed = {
        "take": digest(in_memory().take(70)),
        "another take": digest(in_memory().take(71)),
        "batch size": digest(in_memory(batch=20)),
        "map constant": digest(in_memory(offset=1.0)),
        "another map": digest(in_memory().map(lambda a, b: (a, b * 2))),
        "rows": digest(in_memory(rows=1601)),
        "element spec": digest(in_memory().map(lambda a, b: (a, tf.cast(b, tf.float64)))),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed)
    assert digest(from_files(names)) != digest(from_files(names[:3]))
    assert digest(from_files(names)) != digest(from_files(names[::-1]))


@pytest.mark.slow
def test_two_processes_give_the_digest_of_this_one(pipelines):
    """Under one global seed: a shuffle's seeds (in the digest) pair its own with
    ``tf.random.set_seed``'s, which an earlier test in this process may have set."""
    directory = pipelines["directory"]
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import pipelines as p\n"
              "import tensorflow as tf; tf.random.set_seed(11)\n"
              "from hybridpar.data.pipeline_digest import digest\n"
              "print(digest(p.in_memory()), digest(p.from_files(p.write_files(sys.argv[1]))))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPOSITORY), "TF_CPP_MIN_LOG_LEVEL": "3"}
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script, str(directory)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    tf.random.set_seed(11)
    try:
        here = [digest(pipelines["in_memory"]()),
                digest(pipelines["from_files"](pipelines["names"]))]
        tf.random.set_seed(12)
        reseeded = digest(pipelines["in_memory"]())
    finally:
        tf.random.set_seed(None)
    assert outputs[0] == outputs[1] == here
    assert reseeded != here[0]


class ReadBytes:
    """Counts the bytes of every eager tensor's value taken to NumPy while installed."""

    def __init__(self, monkeypatch) -> None:
        self.reads: list[int] = []
        original = ops._EagerTensorBase.numpy

        def numpy(tensor):
            value = original(tensor)
            self.reads.append(np.asarray(value).nbytes)
            return value

        monkeypatch.setattr(ops._EagerTensorBase, "numpy", numpy)


def big_pipeline(rows: int, first: float = 0.0) -> tf.data.Dataset:
    """``rows`` x 4 KB in memory, in the source and captured by a map."""
    data = np.zeros((rows, 1024), "float32")
    data[0, 0] = first
    tensor = tf.constant(data)
    return (tf.data.Dataset.from_tensor_slices((tensor, tf.zeros((rows,))))
            .map(lambda a, b: (a * tensor[0], b)).shuffle(4).batch(2))


def test_large_data_is_read_in_a_few_blocks_only(monkeypatch):
    """64 MB in the source and in a capture: the digest reads 8 blocks of 4 KB of each (and
    the small tensors whole: 64 KB of labels), not the data; a changed first row (in a
    block) changes it."""
    big = big_pipeline(16384)
    changed = big_pipeline(16384, first=1.0)
    tracemalloc.start()
    try:
        read = ReadBytes(monkeypatch)
        found = digest(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    labels = 16384 * 4  # small: read whole
    blocks = 2 * pipeline_digest.BLOCKS * pipeline_digest.BLOCK_BYTES
    assert labels in read.reads and read.reads.count(pipeline_digest.BLOCK_BYTES) == 16
    assert sum(read.reads) <= labels + blocks + 2**10, read.reads  # + the scalars
    assert peak < 2**20, peak
    assert found != digest(changed)
    assert found != digest(big_pipeline(16383))


def test_a_dataset_built_in_a_function_is_digested_from_its_ops():
    found = []

    def build(count, extra):
        found.append(digest(tf.data.Dataset.range(100).batch(4).take(count + extra)))
        return tf.constant(0)

    for extra in (0, 0, 1):  # traced anew each time
        tf.function(build)(tf.constant(3, tf.int64), extra)
    assert found[0] == found[1] != found[2]


def test_block_starts_spread_over_the_tensor():
    assert pipeline_digest.block_starts(100, 10, 4) == [0, 30, 60, 90]
    assert pipeline_digest.block_starts(5, 10, 4) == [0]
    assert pipeline_digest.block_starts(12, 10, 8) == [0, 1, 2]


def test_stable_names_lose_the_process_counter():
    assert pipeline_digest.stable_name("__inference_Dataset_map_lambda_1234") == (
        "__inference_Dataset_map_lambda")
    assert pipeline_digest.stable_name("pyfunc_3_7") == "pyfunc"
    assert pipeline_digest.stable_name("Identity") == "Identity"

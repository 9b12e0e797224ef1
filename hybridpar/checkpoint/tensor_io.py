"""Checkpoint state in TensorFlow's tensor-bundle format, written by the tasks that hold it.

``snapshot`` reads every part of every logical variable (``layout``) into a
tensor on the variable's own device: nothing is copied to the chief, and
TensorFlow copies a variable's buffer before an update while such a read is
alive, so training on does not change the snapshot. ``write`` then runs one
``SaveV2`` per task that holds parts, all at once (each parameter server
writes its own shards and slots to ``checkpoint.dir`` from its own process)
and merges the bundles' indexes on this task (``MergeV2Checkpoints``), as
``tf.train.Checkpoint``'s multi-device saver does. ``SaveV2`` computes each
tensor's CRC32C as it writes it and stores it in the index, so the data
files are never read back: the manifest holds their sizes and the index's
SHA-256, and every read checks the CRC32C (``check_checksums`` reads all). A sharded variable is
saved as row slices of one logical tensor. ``BundleReader`` restores each
part with a ``RestoreV2`` placed on the part's device, asking for exactly its
rows (the slices are re-cut on read), so a parameter server reads its rows
itself and the chief never holds a table. A ZeRO shard's part of a slot
(``layout.FlatPart``) is saved and read as the boxes of its element range.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_io_ops
from tensorflow.python.training import py_checkpoint_reader

from hybridpar.checkpoint import flat_slices, storage
from hybridpar.checkpoint.layout import FlatPart, Logical, Part
from hybridpar.checkpoint.manifest import (
    CRC32C,
    INDEX_FILE,
    STATE_PREFIX,
    data_file,
    key,
    slice_spec,
)
from hybridpar.errors import CheckpointDamagedError, ConfigError

_HOST_RE = re.compile(r"^(/job:[^/]+/replica:\d+/task:\d+)")


@dataclasses.dataclass(frozen=True)
class Piece:
    """One tensor to write: its key, its slice of the logical tensor and its value."""

    key: str
    spec: str
    value: Any


def local_host() -> str:
    """``/job:chief/replica:0/task:0``: this process's task."""
    return context.context().host_address_space()


def host_of(device: str) -> str:
    """The task part of a device name (this process's task for a local device)."""
    match = _HOST_RE.match(device or "")
    return match[1] if match else local_host()


def task_name(host: str) -> str:
    """``ps:1`` for ``/job:ps/replica:0/task:1``."""
    job = host.split("/job:")[1].split("/")[0]
    return f"{job}:{host.rsplit('task:', 1)[1]}"


def device_of(variable: Any) -> str:
    """The device of a Keras variable or a shard."""
    inner = variable._value if isinstance(variable, keras.Variable) else variable
    return getattr(inner, "device", "") or ""


def read(variable: Any) -> Any:
    """A tensor of ``variable``'s current value, on the variable's device."""
    inner = variable.value if isinstance(variable, keras.Variable) else variable
    return tf.convert_to_tensor(inner)


def snapshot(groups: dict[str, list[Logical]]) -> list[Piece]:
    """Reads every part of every logical variable of ``groups`` (see the module doc)."""
    pieces = []
    for group, logicals in groups.items():
        for index, logical in enumerate(logicals):
            for part in logical.parts:
                if isinstance(part, FlatPart):
                    pieces += _flat_pieces(key(group, index), logical, part)
                else:
                    pieces.append(Piece(key(group, index),
                                        slice_spec(logical.shape, part.offset, part.rows,
                                                   part.axis),
                                        read(part.variable)))
    return pieces


def _flat_pieces(name: str, logical: Logical, part: FlatPart) -> list[Piece]:
    """A flat part as the boxes of the logical tensor it covers (``flat_slices``)."""
    found = flat_slices.boxes(logical.shape, part.start, part.length)
    with tf.device(device_of(part.variable)):
        value = read(part.variable)[part.source:part.source + part.length]
        if found is None:
            return [Piece(name, "", tf.reshape(value, logical.shape))]
        pieces, offset = [], 0
        for box in found:
            size = math.prod(box[1])
            pieces.append(Piece(name, flat_slices.spec(logical.shape, box),
                                tf.reshape(value[offset:offset + size], box[1])))
            offset += size
        return pieces


def assign(part: Part | FlatPart, value: Any) -> None:
    """Writes a part's value (as ``BundleReader.read`` returns it) into its variable."""
    if not isinstance(part, FlatPart):
        part.variable.assign(value)
        return
    inner = part.variable._value if isinstance(part.variable, keras.Variable) else part.variable
    with tf.device(inner.device):
        inner[part.source:part.source + part.length].assign(tf.cast(value, inner.dtype))


def write(partial: str | os.PathLike, pieces: Sequence[Piece],
          written: Sequence[tuple[str, str]] = ()) -> dict[str, dict[str, Any]]:
    """Writes ``pieces`` into ``partial`` as one bundle, each task its own data file.

    Args:
        partial: the checkpoint's partial directory (it exists).
        written: ``(task, bundle prefix)`` of bundles other workers wrote themselves
            (``zero_shards``), merged in here (the directory is shared).

    Returns:
        ``{file name: entry}`` of every file written: ``{"bytes", "sha256", "task"}``
        for the index, ``{"bytes", "checksum": CRC32C, "task"}`` for a data file.
    """
    by_host: dict[str, list[Piece]] = {}
    for piece in pieces:
        by_host.setdefault(host_of(piece.value.device), []).append(piece)
    hosts = sorted(by_host)
    parts_dir = storage.join(partial, "parts")
    prefixes = [os.fspath(storage.join(parts_dir, f"part-{i:05d}")) for i in range(len(hosts))]
    _save_in_parallel([(prefix, host, by_host[host]) for prefix, host in
                       zip(prefixes, hosts, strict=True)])
    me = task_name(local_host())
    with tf.device(f"{local_host()}/device:CPU:0"):
        gen_io_ops.merge_v2_checkpoints(prefixes + [prefix for _, prefix in written],
                                        os.fspath(storage.join(partial, STATE_PREFIX)),
                                        delete_old_dirs=True)
    storage.rmtree(parts_dir)
    for _, prefix in written:
        storage.rmtree(os.path.dirname(prefix))
    size, digest = storage.sha256_of(storage.join(partial, INDEX_FILE))
    entries = {INDEX_FILE: {"bytes": size, "sha256": digest, "task": me}}
    writers = [task_name(host) for host in hosts] + [task for task, _ in written]
    for shard, task in enumerate(writers):
        name = data_file(shard, len(writers))
        entries[name] = {"bytes": storage.size(storage.join(partial, name)),
                         "checksum": CRC32C, "task": task}
    return entries


def _save_in_parallel(bundles: Sequence[tuple[str, str, list[Piece]]]) -> None:
    """One ``SaveV2`` per ``(prefix, host, pieces)``, each on its host, all at once."""
    def save(prefix: str, host: str, group: list[Piece]) -> None:
        with tf.device(f"{host}/device:CPU:0"):
            gen_io_ops.save_v2(prefix, [p.key for p in group], [p.spec for p in group],
                               [p.value for p in group])

    per_host([(host, functools.partial(save, prefix, host, group))
              for prefix, host, group in bundles])


def per_host(calls: Sequence[tuple[str, Callable[[], Any]]]) -> None:
    """Runs each host's calls in their order, the hosts at the same time.

    Run eagerly, an op on another task returns only when it is done, so from one
    thread the parameter servers would write or read one after another; one
    thread per host lets them work at the same time (as ``tf.train.Checkpoint``'s
    multi-device saver does, in a graph). Calls of a single host run in this thread.

    Args:
        calls: ``(host, call)`` pairs (``host_of`` a device).
    """
    by_host: dict[str, list[Callable[[], Any]]] = {}
    for host, call in calls:
        by_host.setdefault(host, []).append(call)

    def run(own: list[Callable[[], Any]]) -> None:
        for call in own:
            call()

    if len(by_host) <= 1:
        for own in by_host.values():
            run(own)
        return
    with concurrent.futures.ThreadPoolExecutor(len(by_host)) as pool:
        for done in [pool.submit(run, own) for own in by_host.values()]:
            done.result()


_SHARD_RE = re.compile(r"shard (\d+)")


def check_checksums(path: str | os.PathLike, shards: int) -> None:
    """Reads every tensor of a format-2 checkpoint, so TensorFlow checks each one's CRC32C.

    Each tensor is read whole, one at a time (a sharded table's slices joined):
    the peak memory is the largest logical tensor.

    Raises:
        CheckpointDamagedError: naming the data file and the tensor that fail.
    """
    prefix = os.fspath(storage.join(path, STATE_PREFIX))
    try:
        reader = py_checkpoint_reader.NewCheckpointReader(prefix)
    except (tf.errors.OpError, ValueError) as err:
        raise CheckpointDamagedError(f"{os.fspath(path)}/{INDEX_FILE} is unreadable "
                                     f"({_first_line(err)})") from None
    for name in sorted(reader.get_variable_to_shape_map()):
        try:
            reader.get_tensor(name)
        except (tf.errors.OpError, ValueError) as err:
            shard = _SHARD_RE.search(str(err))
            where = data_file(int(shard[1]), shards) if shard else "a data file"
            raise CheckpointDamagedError(
                f"{os.fspath(path)}: {where} fails TensorFlow's CRC32C check of {name} "
                f"({_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    return str(getattr(err, "message", err)).splitlines()[0]


# What RestoreV2 raises for a file whose bytes are not what was written: a CRC32C that does
# not match, a file cut short, an index entry that points outside its file.
_DAMAGE = (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError)


class BundleReader:
    """Reads a format-2 checkpoint's tensors, each part on its own device."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self.prefix = os.fspath(storage.join(path, STATE_PREFIX))

    def read(self, name: str, logical: Logical, part: Part) -> Any:
        """The rows of ``part`` (all of the logical tensor when it is whole), read by the
        task that holds ``part``.

        Raises:
            CheckpointDamagedError: when a file fails TensorFlow's CRC32C or is unreadable.
            ConfigError: when that task cannot see the checkpoint's files.
        """
        host = host_of(device_of(part.variable))
        try:
            with tf.device(f"{host}/device:CPU:0"):
                if isinstance(part, FlatPart):
                    return self._flat(name, logical, part)
                spec = slice_spec(logical.shape, part.offset, part.rows, part.axis)
                return gen_io_ops.restore_v2(self.prefix, [name], [spec],
                                             [tf.as_dtype(logical.dtype)])[0]
        except tf.errors.NotFoundError as err:
            raise ConfigError(
                f"{task_name(host)} cannot read checkpoint {os.fspath(self.path)} "
                f"({err.message.splitlines()[0]}). checkpoint.dir must be a directory that "
                "every task shares (the ps tasks read their own rows), not a local directory "
                "of each machine."
            ) from None
        except _DAMAGE as err:
            raise self._damaged(name, err) from None

    def _damaged(self, name: str, err: tf.errors.OpError) -> CheckpointDamagedError:
        return CheckpointDamagedError(f"{os.fspath(self.path)}: {name} cannot be read "
                                      f"({err.message.splitlines()[0]})")

    def _flat(self, name: str, logical: Logical, part: FlatPart) -> Any:
        """A flat part's elements: its boxes read (re-cut from the stored slices), joined."""
        found = flat_slices.boxes(logical.shape, part.start, part.length)
        specs = [""] if found is None else [flat_slices.spec(logical.shape, b) for b in found]
        if not specs:
            return tf.zeros([0], logical.dtype)
        values = gen_io_ops.restore_v2(self.prefix, [name] * len(specs), specs,
                                       [tf.as_dtype(logical.dtype)] * len(specs))
        return tf.concat([tf.reshape(v, [-1]) for v in values], 0)

    def array(self, name: str, dtype: str) -> np.ndarray:
        """One whole tensor as a host array (small state: PowerSGD's, an evaluator's weights,
        the input's position).

        Raises:
            CheckpointDamagedError: when its file fails TensorFlow's CRC32C or is unreadable.
            tf.errors.NotFoundError: when the checkpoint has no tensor ``name``.
        """
        try:
            with tf.device(f"{local_host()}/device:CPU:0"):
                return gen_io_ops.restore_v2(self.prefix, [name], [""],
                                             [tf.as_dtype(dtype)])[0].numpy()
        except _DAMAGE as err:
            raise self._damaged(name, err) from None


class ArrayReader:
    """Reads a checkpoint whose values are host arrays already (format 1, an evaluator's read)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def read(self, name: str, logical: Logical, part: Part) -> Any:
        value = self.arrays[name]
        if isinstance(part, FlatPart):
            return np.reshape(value, [-1])[part.start:part.start + part.length]
        if part.offset is None:
            return value
        return np.take(value, range(part.offset, part.offset + part.rows), axis=part.axis)

    def array(self, name: str, dtype: str) -> np.ndarray:
        return self.arrays[name]


def arrays_of(path: str | os.PathLike, specs: dict[str, list[dict[str, Any]]],
              groups: Sequence[str]) -> dict[str, np.ndarray]:
    """Whole host arrays of ``groups`` of a format-2 checkpoint (the evaluator reads weights)."""
    reader = BundleReader(path)
    return {key(group, index): reader.array(key(group, index), spec["dtype"])
            for group in groups for index, spec in enumerate(specs.get(group, []))}

"""File access for checkpoints on any filesystem TensorFlow knows (``tf.io.gfile``).

Local paths go through ``os`` (so writes can be fsynced, and TensorFlow is
not imported: the evaluator's watcher and the format's tests stay light); a
path with a URL scheme (``ram://``, ``gs://``, ``s3://``, ``hdfs://``)
through ``tf.io.gfile``.
Paths are strings or ``os.PathLike``; a local one comes back as a ``Path``,
a URL as a ``str`` (``pathlib`` would fold ``ram://x`` into ``ram:/x``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hybridpar.errors import ConfigError

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
CHUNK = 1 << 22

Location = Path | str


def _tf() -> Any:
    import tensorflow as tf  # only for URL paths

    return tf


def _gfile() -> Any:
    return _tf().io.gfile


def _missing(err: BaseException) -> bool:
    """True for a file that does not exist, locally or on a TensorFlow filesystem."""
    return isinstance(err, FileNotFoundError) or type(err).__name__ == "NotFoundError"


def scheme(path: str | os.PathLike) -> str | None:
    """``gs`` for ``gs://b/x``; ``None`` for a local path."""
    match = _SCHEME_RE.match(os.fspath(path))
    return match[1] if match else None


def location(path: str | os.PathLike) -> Location:
    """``path`` as a ``Path`` when local, else as the URL string."""
    text = os.fspath(path)
    return text if scheme(text) else Path(text)


def join(path: str | os.PathLike, *names: str) -> Location:
    if scheme(path):
        return "/".join([os.fspath(path).rstrip("/"), *names])
    return Path(path).joinpath(*names)


def name(path: str | os.PathLike) -> str:
    return os.fspath(path).rstrip("/").rsplit("/", 1)[-1]


def check_scheme(path: str | os.PathLike, key: str = "checkpoint.dir") -> None:
    """Fails when TensorFlow has no filesystem for ``path``'s URL scheme.

    Raises:
        ConfigError: naming the key, the value and the schemes TensorFlow has.
    """
    found = scheme(path)
    if found is None or found == "file":
        return
    tf = _tf()
    try:
        _gfile().exists(os.fspath(path))
    except tf.errors.UnimplementedError:
        known = ", ".join(sorted(set(_registered()) - {""})) or "none"
        raise ConfigError(
            f"{key}={os.fspath(path)!r}: TensorFlow has no filesystem for the URL scheme "
            f"{found!r} (it has: {known}). Use a local path or one of those schemes; gs:// "
            "needs nothing more, s3:// needs the tensorflow-io package imported."
        ) from None


def _registered() -> list[str]:
    try:
        from tensorflow.python.lib.io import _pywrap_file_io

        return list(_pywrap_file_io.GetRegisteredSchemes())
    except (ImportError, AttributeError):
        return ["ram", "gs", "file"]


def exists(path: str | os.PathLike) -> bool:
    if scheme(path):
        return _gfile().exists(os.fspath(path))
    return os.path.exists(path)


def isdir(path: str | os.PathLike) -> bool:
    if scheme(path):
        return _gfile().isdir(os.fspath(path))
    return os.path.isdir(path)


def listdir(path: str | os.PathLike) -> list[str]:
    """Names in a directory (``[]`` when it does not exist)."""
    try:
        if scheme(path):
            return [n.rstrip("/") for n in _gfile().listdir(os.fspath(path))]
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except Exception as err:
        if _missing(err):
            return []
        raise


def makedirs(path: str | os.PathLike) -> None:
    if scheme(path):
        _gfile().makedirs(os.fspath(path))
    else:
        os.makedirs(path, exist_ok=True)


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Renames a file or directory (atomic on POSIX; a copy on object stores)."""
    if scheme(source):
        _gfile().rename(os.fspath(source), os.fspath(target), overwrite=True)
    else:
        os.replace(source, target)


def rmtree(path: str | os.PathLike) -> None:
    """Removes a directory tree, ignoring one that is already gone."""
    if scheme(path):
        try:
            _gfile().rmtree(os.fspath(path))
        except Exception as err:
            if not _missing(err):
                raise
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove(path: str | os.PathLike) -> None:
    """Removes a file, ignoring one that is already gone."""
    try:
        if scheme(path):
            _gfile().remove(os.fspath(path))
        else:
            os.unlink(path)
    except Exception as err:
        if not _missing(err):
            raise


def size(path: str | os.PathLike) -> int | None:
    """A file's size in bytes, ``None`` when it is missing."""
    try:
        if scheme(path):
            return int(_gfile().stat(os.fspath(path)).length)
        return os.stat(path).st_size
    except Exception as err:
        if _missing(err):
            return None
        raise


def open_file(path: str | os.PathLike, mode: str = "rb") -> Any:
    """A file object (``_gfile().GFile`` for URLs)."""
    if scheme(path):
        return _gfile().GFile(os.fspath(path), mode)
    return open(path, mode)


def chunks(stream: Any, chunk: int = CHUNK) -> Iterator[bytes]:
    while block := stream.read(chunk):
        yield block


def sha256_of(path: str | os.PathLike) -> tuple[int, str]:
    """``(bytes, SHA-256)`` of a file, read in chunks.

    Raises:
        FileNotFoundError: when it is missing.
    """
    digest, total = hashlib.sha256(), 0
    try:
        with open_file(path, "rb") as stream:
            for block in chunks(stream):
                digest.update(block)
                total += len(block)
    except Exception as err:
        if _missing(err):
            raise FileNotFoundError(os.fspath(path)) from None
        raise
    return total, digest.hexdigest()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes a file and, when local, fsyncs it."""
    with open_file(path, "wb") as stream:
        stream.write(data)
        stream.flush()
        if not scheme(path):
            os.fsync(stream.fileno())


def read_text(path: str | os.PathLike) -> str:
    """A file's text.

    Raises:
        FileNotFoundError: when it is missing.
    """
    try:
        with open_file(path, "rb") as stream:
            return stream.read().decode()
    except Exception as err:
        if _missing(err):
            raise FileNotFoundError(os.fspath(path)) from None
        raise


def fsync_dir(path: str | os.PathLike) -> None:
    """Makes a rename in a local directory durable (nothing to do on other filesystems)."""
    if scheme(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def ensure_writable(directory: str | os.PathLike, key: str = "checkpoint.dir") -> Location:
    """Creates ``directory`` if needed and proves it can be written.

    Raises:
        ConfigError: naming the key, the directory and the error (an unknown
            URL scheme among them).
    """
    check_scheme(directory, key)
    probe = join(directory, f".hybridpar-write-probe-{os.getpid()}")
    try:
        makedirs(directory)
        write_bytes(probe, b"")
        remove(probe)
    except Exception as err:  # OSError locally, tf.errors.OpError elsewhere
        reason = getattr(err, "strerror", None) or getattr(err, "message", None) or err
        raise ConfigError(
            f"{key}={str(directory)!r} is not a writable directory "
            f"({reason}). Choose a directory this process can create and "
            "write, before training starts."
        ) from None
    return location(directory)

"""TFDS loading that never downloads.

`load_tfds` reads a prepared TensorFlow Datasets split from a data directory.
Data sets embedded in hybridpar (`EMBEDDED_DATASETS`) are generated locally
from files shipped with installed packages, so they are prepared on first use;
every other TFDS data set must already be prepared in ``data_dir`` (no network
is touched, no download is attempted).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf
    import tensorflow_datasets as tfds

__all__ = [
    "EMBEDDED_DATASETS",
    "DatasetNotFoundError",
    "dataset_files",
    "dataset_info",
    "load_tfds",
]

logger = logging.getLogger(__name__)

#: TFDS data sets hybridpar generates locally (no download) when missing.
EMBEDDED_DATASETS = ("hybridpar_digits", "hybridpar_clicks")


class DatasetNotFoundError(FileNotFoundError):
    """A data set is unknown, or is not prepared in the data directory searched.

    The message names the data set, the split and the directory, and says how
    to prepare the data.
    """


def load_tfds(
    name: str,
    split: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    as_supervised: bool = False,
    shuffle_files: bool = False,
    read_config: tfds.ReadConfig | None = None,
) -> tf.data.Dataset:
    """Loads one split of a prepared TFDS data set, without downloading.

    Args:
        name: TFDS name, e.g. ``"hybridpar_digits"`` or ``"mnist:3.0.1"``.
        split: Split name or TFDS split expression, e.g. ``"train[:10%]"``.
        data_dir: TFDS data directory; `None` means TFDS's default one.
        as_supervised: If True, yield ``(input, target)`` tuples from the data
            set's ``supervised_keys``; else dicts of all features (as
            `tfds.load`).
        shuffle_files: Whether TFDS reads the split's files in shuffled order.
        read_config: Optional `tfds.ReadConfig` passed to TFDS.

    Returns:
        The split as a `tf.data.Dataset`.

    Raises:
        DatasetNotFoundError: The name is not a known TFDS data set, or it is
            not prepared in ``data_dir`` (embedded data sets are prepared
            instead).
        ValueError: The split does not exist, or ``as_supervised`` is asked of
            a data set without ``supervised_keys``.
    """
    builder = _prepared_builder(name, split, data_dir)
    _check_split(builder, name, split, exact=False)
    if as_supervised and builder.info.supervised_keys is None:
        raise ValueError(
            f"Data set {name!r} has no supervised_keys, so it cannot be loaded with "
            f"as_supervised=True. Received: as_supervised={as_supervised}. Load it "
            "with as_supervised=False and map the feature dict to (input, target)."
        )
    return builder.as_dataset(
        split=split,
        as_supervised=as_supervised,
        shuffle_files=shuffle_files,
        read_config=read_config,
    )


def dataset_files(
    name: str, split: str, data_dir: str | os.PathLike[str] | None = None
) -> list[str]:
    """Returns the record files of a prepared split, in shard order.

    Embedded data sets are prepared first if needed, as in `load_tfds`.

    Args:
        name: TFDS name, e.g. ``"hybridpar_digits"``.
        split: A whole split name such as ``"train"`` (no slicing).
        data_dir: TFDS data directory; `None` means TFDS's default one.

    Returns:
        The paths of the split's shard files.

    Raises:
        DatasetNotFoundError: As for `load_tfds`.
        ValueError: The split is not one of the data set's splits.
    """
    builder = _prepared_builder(name, split, data_dir)
    _check_split(builder, name, split, exact=True)
    return [os.fspath(path) for path in builder.info.splits[split].filepaths]


def dataset_info(
    name: str, data_dir: str | os.PathLike[str] | None = None
) -> tfds.core.DatasetInfo:
    """Returns the ``DatasetInfo`` (features, splits, supervised keys) of a data set.

    Embedded data sets are prepared first if needed, as in `load_tfds`.

    Raises:
        DatasetNotFoundError: As for `load_tfds`.
    """
    return _prepared_builder(name, None, data_dir).info


def _base_name(name: str) -> str:
    """``"ds/config:1.0.0"`` -> ``"ds"``."""
    return name.split(":")[0].split("/")[0].strip()


def _prepared_builder(
    name: str, split: str | None, data_dir: str | os.PathLike[str] | None
) -> tfds.core.DatasetBuilder:
    """Returns a builder whose data is prepared, preparing embedded data sets."""
    import tensorflow_datasets as tfds

    import hybridpar.data.builders.clicks
    import hybridpar.data.builders.digits  # noqa: F401  (registers the embedded builders)

    data_dir = os.fspath(data_dir) if data_dir is not None else None
    base = _base_name(name)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError as err:
        raise DatasetNotFoundError(_unknown_name_message(name, data_dir)) from err
    if builder.is_prepared():
        return builder
    if base in EMBEDDED_DATASETS:
        return _prepare_embedded(builder, name, data_dir)
    raise DatasetNotFoundError(_not_prepared_message(builder, name, split, data_dir))


def _prepare_embedded(
    builder: tfds.core.DatasetBuilder, name: str, data_dir: str | None
) -> tfds.core.DatasetBuilder:
    """Generates an embedded data set into ``builder.data_dir``; returns it ready."""
    import tensorflow_datasets as tfds

    logger.info(
        "Preparing embedded data set %r in %s (generated locally, no download).",
        name,
        builder.data_dir,
    )
    config = tfds.download.DownloadConfig(try_download_gcs=False)
    try:
        with _quiet_tfds():
            builder.download_and_prepare(download_config=config)
    except OSError:
        # Another process (e.g. a second worker sharing data_dir) may have
        # finished first: its rename wins and ours fails. Use its copy.
        builder = tfds.builder(name, data_dir=data_dir)
        if not builder.is_prepared():
            raise
    return builder


@contextlib.contextmanager
def _quiet_tfds() -> Iterator[None]:
    """Silences TFDS's progress bars and its bare prints while preparing."""
    from tensorflow_datasets.core.utils import tqdm_utils

    was_active = getattr(tqdm_utils, "_active", True)
    tqdm_utils.display_progress_bar(False)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        tqdm_utils.display_progress_bar(was_active)


def _check_split(builder: tfds.core.DatasetBuilder, name: str, split: str, *, exact: bool) -> None:
    """Raises ValueError naming the available splits if ``split`` is not one."""
    splits = builder.info.splits
    available = ", ".join(sorted(splits.keys()))
    if exact and split not in splits:
        raise ValueError(
            f"Data set {name!r} has no split {split!r}; expected one of: {available} "
            f"(a whole split, no slicing). Received: split={split!r}."
        )
    try:
        splits[split]
    except (KeyError, ValueError, AssertionError) as err:
        raise ValueError(
            f"Data set {name!r} has no split {split!r} ({err}). Available splits: "
            f"{available}; TFDS slicing such as 'train[:10%]' is allowed. "
            f"Received: split={split!r}."
        ) from err


def _prepare_hint(name: str, data_dir: str) -> str:
    return (
        f"To prepare it, on a machine with internet run `tfds build {name} "
        f"--data_dir {data_dir}` (or python -c 'import tensorflow_datasets as tfds; "
        f'tfds.builder("{name}", data_dir="{data_dir}").download_and_prepare()\') '
        f"and copy {data_dir} here."
    )


def _not_prepared_message(
    builder: tfds.core.DatasetBuilder, name: str, split: str | None, data_dir: str | None
) -> str:
    root = os.fspath(builder.data_dir_root)
    searched = root if data_dir is not None else f"{root} (TFDS's default data_dir)"
    message = (
        f"TFDS data set {name!r}{f' (split {split!r})' if split else ''} is not prepared "
        "in data_dir "
        f"{searched}: expected its files in {os.fspath(builder.data_dir)}. "
        "hybridpar never downloads data. "
    )
    message += _prepare_hint(_base_name(name), root)
    versions = _versions_present(os.path.join(root, builder.name))
    if versions:
        message += (
            f" Other versions are present there: {', '.join(versions)}; load one "
            f"with name='{builder.name}:<version>'."
        )
    return message


def _versions_present(dataset_dir: str) -> list[str]:
    """Version directories (``1.2.3``) prepared under ``data_dir/<name>``."""
    if not os.path.isdir(dataset_dir):
        return []
    found = []
    for root, dirs, files in os.walk(dataset_dir):
        if "dataset_info.json" in files:
            found.append(os.path.relpath(root, dataset_dir))
        dirs[:] = [d for d in dirs if not d.startswith("incomplete")]
    return sorted(found)


def _unknown_name_message(name: str, data_dir: str | None) -> str:
    import tensorflow_datasets as tfds

    known = tfds.list_builders(with_community_datasets=False)
    close = difflib.get_close_matches(_base_name(name), known, n=3)
    where = data_dir if data_dir is not None else "TFDS's default data_dir"
    message = (
        f"Unknown data set {name!r}: it is not a registered TFDS data set and no "
        f"prepared copy was found in {where}. Received: name={name!r}. "
        f"Data sets embedded in hybridpar (generated locally, no download): "
        f"{', '.join(EMBEDDED_DATASETS)}. "
    )
    if close:
        message += f"Did you mean {' or '.join(repr(c) for c in close)}? "
    message += (
        "For a custom TFDS builder, import the module that defines it before "
        "loading, or pass the data_dir holding its prepared files."
    )
    return message

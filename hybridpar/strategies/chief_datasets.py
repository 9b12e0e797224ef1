"""Datasets a parameter-server chief made before it connected, moved onto the chief.

Connecting renames the chief's local job (``hybridpar.compat.local_job``),
and a dataset made before it lives on ``/job:localhost``. A dataset is a
pipeline of dataset objects held in memory; only its iterator is placed,
next to the dataset's variant tensor. So the chief's ``evaluate``,
``predict`` and validation (``strategies.ps_training``) are given
``dataset.take(-1)`` made on the chief's device: the same pipeline (its data,
shuffle seeds, caches and file readers), moved without copying or
serializing anything, once per dataset object. What cannot move is named in
a ``ConfigError`` before anything runs: a pipeline function that uses a
variable or lookup table made before the connection, or that runs Python
(``Dataset.from_generator``, ``tf.py_function``: TensorFlow pins those to
``/job:localhost``). An override: only hybridpar's parameter-server runner
calls ``dataset_on_chief``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context

from hybridpar.compat.local_job import stranded
from hybridpar.errors import ConfigError

logger = logging.getLogger("hybridpar")

_MOVED = "_hybridpar_on_chief"


def _pipeline(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """The dataset and every dataset it reads from."""
    stack, seen = [dataset], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        try:
            stack.extend(current._inputs())
        except NotImplementedError:  # a dataset class that does not list its inputs
            continue


def _nodes(function: Any) -> Iterator[Any]:
    """The nodes of a pipeline function and of the functions it calls."""
    graph_def = function.graph.as_graph_def()
    yield from graph_def.node
    for inner in graph_def.library.function:
        yield from inner.node_def


def _what_cannot_move(dataset: tf.data.Dataset) -> str | None:
    """Why the pipeline cannot run on the chief, or None when it can."""
    for part in _pipeline(dataset):
        for wrapper in part._functions():
            function = wrapper.function
            for captured in function.captured_inputs:
                if captured.dtype == tf.resource and stranded(captured.device):
                    return (f"its function {function.name} uses a variable or lookup table "
                            "created then")
            for node in _nodes(function):
                if node.device and stranded(node.device):
                    return (f"its function {function.name} runs {node.op}, Python code "
                            "(Dataset.from_generator, tf.py_function or tf.numpy_function) "
                            "that TensorFlow pinned to /job:localhost")
    return None


def _chief_cpu() -> str:
    server_def = context.get_server_def()
    return f"/job:{server_def.job_name}/replica:0/task:{server_def.task_index}/device:CPU:0"


def dataset_on_chief(dataset: Any, role: str) -> Any:
    """``dataset`` where this chief can iterate it (anything else is returned as is).

    Args:
        dataset: what the user passed (a dataset, arrays, ...).
        role: the dataset's part in the call, for the error, e.g.
            ``"The validation dataset (validation_data)"``.

    Raises:
        ConfigError: for a dataset made before the connection whose
            pipeline cannot run on the chief.
    """
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    variant = dataset._variant_tensor
    if not stranded(getattr(variant, "device", "")):
        return dataset
    moved = getattr(dataset, _MOVED, None)
    if moved is None:
        reason = _what_cannot_move(dataset)
        if reason is not None:
            raise ConfigError(
                f"{role} was created before hybridpar.scope() connected this chief to the "
                f"parameter-server cluster, and {reason}. What was created before the "
                "connection lives on /job:localhost, which the connection removed: the "
                "dataset can move to the chief, that cannot. Create the dataset, and what its "
                "functions use, after entering the scope: `with hybridpar.scope(config): "
                f"...` then `dataset = make_dataset()`. Received: {dataset!r}."
            )
        with tf.device(_chief_cpu()):
            moved = dataset.take(-1)
        setattr(dataset, _MOVED, moved)
        logger.info("hybridpar: %s was created before this chief connected to the cluster; "
                    "it runs on %s (moved, nothing copied)", role.lower(), _chief_cpu())
    return moved

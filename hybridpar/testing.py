"""Helpers for running hybridpar on a machine without accelerators."""

from __future__ import annotations

import tensorflow as tf

from hybridpar.errors import ConfigError, RuntimeMismatchError


def use_logical_cpus(n: int, intra_op_threads: int | None = None) -> list[str]:
    """Splits the host CPU into ``n`` logical CPU devices.

    Call it before TensorFlow touches its devices (before any op, dataset or
    model). Calling it again with the same ``n`` is harmless.

    Args:
        n: number of logical CPU devices.
        intra_op_threads: threads per op, e.g. 1 so that ops on different
            logical devices really run side by side.

    Returns:
        The logical CPU device names (listing them starts TensorFlow's runtime).

    Raises:
        ConfigError: if ``n`` is not a positive integer.
        RuntimeMismatchError: if TensorFlow already initialised a different
            number of devices.
    """
    configure_logical_cpus(n, intra_op_threads)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def configure_logical_cpus(n: int, intra_op_threads: int | None = None) -> None:
    """``use_logical_cpus`` without starting TensorFlow's runtime, so that a
    multi-worker cluster can still be joined afterwards.

    Raises:
        ConfigError: if ``n`` is not a positive integer.
        RuntimeMismatchError: if TensorFlow already initialised a different
            number of devices.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"use_logical_cpus needs a positive integer. Received: n={n!r}.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
        if intra_op_threads is not None:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    except RuntimeError:
        existing = [d.name for d in tf.config.list_logical_devices("CPU")]
        raise RuntimeMismatchError(
            f"use_logical_cpus({n}) came too late: TensorFlow has already initialised its "
            f"devices ({len(existing)} logical CPU(s): {', '.join(existing)}). Call it "
            "right after `import hybridpar`, before any TensorFlow op, dataset or model "
            "is created. On a multi-worker cluster, where `import hybridpar` already "
            f"starts TensorFlow, set HYBRIDPAR_LOGICAL_CPUS={n} in the environment instead."
        ) from None

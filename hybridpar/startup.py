"""Preparing this process before its first TensorFlow op: ``hybridpar.initialize()``.

TensorFlow fixes its logical devices when its runtime starts, and refuses to
start collective ops once any op has run ("Collective ops must be configured
at program startup"), yet users build their tf.data pipeline before they enter
a strategy scope. ``initialize()`` does both start-up steps: it splits the CPU
into logical devices when asked, and brings a chief or worker of a
multi-worker cluster into that cluster. ``import hybridpar`` calls it when the
environment names a cluster (``TF_CONFIG``, or a Slurm step with several
tasks); any other process calls it itself, or never.

This module imports no TensorFlow until ``initialize()`` runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hybridpar.errors import ConfigError
from hybridpar.topology.cluster import ClusterInfo, cluster_from_env

LOGICAL_CPUS_VARIABLE = "HYBRIDPAR_LOGICAL_CPUS"


def logical_cpus_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The number of logical CPU devices ``HYBRIDPAR_LOGICAL_CPUS`` asks for, if any.

    Raises:
        ConfigError: when the variable is set but not a positive integer.
    """
    value = (os.environ if environ is None else environ).get(LOGICAL_CPUS_VARIABLE)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"{LOGICAL_CPUS_VARIABLE} must be a positive integer. Received: {value!r}."
        )
    return int(value)


def initialize(logical_cpus: int | None = None) -> ClusterInfo | None:
    """Prepares this process for hybridpar; call it before the first TensorFlow op.

    Splits the CPU into ``logical_cpus`` logical devices (default:
    ``HYBRIDPAR_LOGICAL_CPUS``, else no split), then, on a chief or worker of
    a multi-worker cluster without ps tasks (``TF_CONFIG``, or a Slurm step),
    starts this task's server and joins the cluster. Calling it again with the
    same arguments does nothing more.

    Args:
        logical_cpus: logical CPU devices to make (CPU-only hosts and tests).

    Returns:
        The cluster this process belongs to, or ``None`` without one.

    Raises:
        ConfigError: for a bad ``TF_CONFIG`` or ``HYBRIDPAR_LOGICAL_CPUS``, when
            an op already ran before a cluster could be joined, or when the
            cluster does not form.
        RuntimeMismatchError: when TensorFlow already made a different number
            of logical devices.
    """
    from hybridpar import testing
    from hybridpar.strategies import cluster_join

    count = logical_cpus if logical_cpus is not None else logical_cpus_from_env()
    if count is not None:
        testing.configure_logical_cpus(count)
    cluster = cluster_from_env()
    if cluster is not None and cluster.runs_collectives:
        cluster_join.bring_up(cluster)
    return cluster


def initialize_if_asked() -> None:
    """What ``import hybridpar`` does: ``initialize()`` where the environment names a cluster.

    A bad ``HYBRIDPAR_LOGICAL_CPUS`` fails in every process, also where
    nothing is initialized (the launcher, a plain script).
    """
    logical_cpus_from_env()
    if cluster_from_env() is not None:
        initialize()

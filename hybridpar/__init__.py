"""hybridpar: one declarative config for hybrid data and model parallel Keras training.

``import hybridpar`` stays light: the config, errors and cluster reading are
plain Python; the names that need TensorFlow are imported on first use. When
``TF_CONFIG`` names a multi-worker cluster, importing hybridpar joins it,
because TensorFlow cannot start collectives once any op has run.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from hybridpar.config import StrategyConfig
from hybridpar.errors import (
    CheckpointDamagedError,
    CheckpointMismatchError,
    CheckpointWriteError,
    ConfigError,
    ParameterServerUnavailableError,
    RuntimeMismatchError,
)
from hybridpar.logs import log_to_stderr
from hybridpar.topology.cluster import cluster_from_env

__version__ = "0.1.0"

_LAZY = {
    "HybridStrategy": "hybridpar.hybrid",
    "build": "hybridpar.hybrid",
    "current": "hybridpar.hybrid",
    "scope": "hybridpar.hybrid",
    "stage": "hybridpar.hybrid",
}
_LAZY_MODULES = {
    "callbacks": "hybridpar.callbacks",
    "checkpoint": "hybridpar.checkpoint",
    "compat": "hybridpar.compat",
    "data": "hybridpar.data",
    "parameter_server": "hybridpar.strategies.ps_training",
    "pipeline": "hybridpar.pipeline",
    "ray_train": "hybridpar.ray_train",
    "report": "hybridpar.report",
    "testing": "hybridpar.testing",
}

__all__ = [
    "CheckpointDamagedError",
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "ConfigError",
    "HybridStrategy",
    "ParameterServerUnavailableError",
    "RuntimeMismatchError",
    "StrategyConfig",
    "__version__",
    "build",
    "callbacks",
    "checkpoint",
    "compat",
    "current",
    "data",
    "log_to_stderr",
    "pipeline",
    "ray_train",
    "report",
    "scope",
    "stage",
    "testing",
]


def _is_launcher() -> bool:
    """True in `hybridpar launch`/`tf-config` processes, which must not join a cluster."""
    program = sys.argv[0] if sys.argv else ""
    if program.endswith(os.path.join("hybridpar", "launch", "__main__.py")):
        return True
    return os.path.basename(program) == "hybridpar" and sys.argv[1:2] in (["launch"], ["tf-config"])


def _split_cpu_from_env() -> None:
    """``HYBRIDPAR_LOGICAL_CPUS=n`` splits the CPU into n logical devices at import.

    Logical devices must be made before TensorFlow's runtime starts, which on a
    multi-worker cluster is at ``import hybridpar``; this is how each task of a
    CPU-only cluster gets devices for model-parallel stages.
    """
    value = os.environ.get("HYBRIDPAR_LOGICAL_CPUS")
    if not value or _is_launcher():
        return
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"HYBRIDPAR_LOGICAL_CPUS must be a positive integer. Received: {value!r}."
        )
    from hybridpar import testing

    testing.configure_logical_cpus(int(value))


def _join_cluster_from_tf_config() -> None:
    """Joins a multi-worker TF_CONFIG cluster before the user's code runs any op."""
    if _is_launcher():
        return
    cluster = cluster_from_env()
    if (
        cluster is not None
        and cluster.num_ps == 0
        and cluster.num_workers > 1
        and cluster.task_type in ("chief", "worker")
    ):
        from hybridpar.strategies import cluster_join

        cluster_join.bring_up(cluster)


_split_cpu_from_env()
_join_cluster_from_tf_config()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'hybridpar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""hybridpar: one declarative config for hybrid data and model parallel Keras training.

``import hybridpar`` stays light: the config, errors and cluster reading are
plain Python; the names that need TensorFlow are imported on first use. When
the environment names a cluster (``TF_CONFIG``, or a Slurm step), importing
hybridpar calls ``initialize()``, which joins a multi-worker cluster because
TensorFlow cannot start collectives once any op has run.
"""

from __future__ import annotations

import importlib
from typing import Any

from hybridpar import startup
from hybridpar.config import StrategyConfig
from hybridpar.errors import (
    CheckpointDamagedError,
    CheckpointMismatchError,
    CheckpointWriteError,
    ConfigError,
    InputPositionError,
    ParameterServerUnavailableError,
    RuntimeMismatchError,
)
from hybridpar.logs import log_to_stderr
from hybridpar.startup import initialize

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
    "InputPositionError",
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
    "initialize",
    "log_to_stderr",
    "pipeline",
    "ray_train",
    "report",
    "scope",
    "stage",
    "testing",
]


startup.initialize_if_asked()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'hybridpar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

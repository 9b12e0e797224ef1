"""hybridpar: one declarative config for hybrid data and model parallel Keras training.

``import hybridpar`` stays light: the config and errors are plain Python; the
names that need TensorFlow are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError, RuntimeMismatchError

__version__ = "0.1.0"

_LAZY = {
    "HybridStrategy": "hybridpar.strategy",
    "build": "hybridpar.strategy",
    "current": "hybridpar.strategy",
    "scope": "hybridpar.strategy",
}
_LAZY_MODULES = ("callbacks", "data", "testing")

__all__ = [
    "ConfigError",
    "HybridStrategy",
    "RuntimeMismatchError",
    "StrategyConfig",
    "__version__",
    "build",
    "callbacks",
    "current",
    "data",
    "scope",
    "testing",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"hybridpar.{name}")
    raise AttributeError(f"module 'hybridpar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""Which TensorFlow/Keras lines hybridpar's fixes were verified on, and the version gate.

The fixes read and replace Keras/TensorFlow internals, which change between
minor versions without notice. On an unverified line hybridpar refuses to
build a strategy; setting ``HYBRIDPAR_ALLOW_UNVERIFIED=1`` turns the refusal
into a warning (once per process) for people who want to try a newer release.
"""

from __future__ import annotations

import logging
import os

import keras
import tensorflow as tf

logger = logging.getLogger("hybridpar")

VERIFIED_TF = ("2.21",)
VERIFIED_KERAS = ("3.15",)
ALLOW_ENV = "HYBRIDPAR_ALLOW_UNVERIFIED"

_warned = False


def _line(version: str) -> str:
    return ".".join(version.split(".")[:2])


def verified() -> bool:
    """True when the installed TensorFlow and Keras are lines the fixes were verified on."""
    return _line(tf.__version__) in VERIFIED_TF and _line(keras.__version__) in VERIFIED_KERAS


def check_versions() -> None:
    """Refuses TensorFlow/Keras lines whose internals were not verified.

    Raises:
        RuntimeError: naming the installed and the verified versions, unless
            ``HYBRIDPAR_ALLOW_UNVERIFIED=1`` is set (then a warning is logged).
    """
    global _warned
    if verified():
        return
    message = (
        f"hybridpar relies on TensorFlow/Keras internals verified on TensorFlow "
        f"{', '.join(VERIFIED_TF)} and Keras {', '.join(VERIFIED_KERAS)}; installed: "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}."
    )
    if os.environ.get(ALLOW_ENV) == "1":
        if not _warned:
            _warned = True
            logger.warning("hybridpar: %s %s=1 is set, so hybridpar goes on; its fixes may "
                           "misbehave on this version.", message, ALLOW_ENV)
        return
    raise RuntimeError(
        f"{message} Install the verified versions (pip install -e . pins them), or set "
        f"{ALLOW_ENV}=1 to try this version anyway."
    )

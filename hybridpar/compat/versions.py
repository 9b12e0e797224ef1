"""The TensorFlow/Keras pairs hybridpar's fixes are verified on, and the version gate.

The fixes read and replace Keras/TensorFlow internals, which change between
minor versions without notice, so hybridpar supports the pairs whose upstream
reproductions and cross-mode tests ran (``make test-versions``). On any other
pair it refuses to build a strategy; setting ``HYBRIDPAR_ALLOW_UNVERIFIED=1``
turns the refusal into a warning (once per process) for people who want to try
another release. The matrix and the messages are pure functions of version
strings; only ``installed_versions`` imports TensorFlow and Keras.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("hybridpar")

# TensorFlow line -> the Keras lines verified with it. TensorFlow 2.19 and 2.20 pair
# with the Keras 3 that `pip install tensorflow==2.19.*` resolves today (their
# requirement is keras>=3.5 / >=3.10); Keras before 3.13 lacks internals the fixes use.
SUPPORTED: dict[str, tuple[str, ...]] = {
    "2.19": ("3.15",),
    "2.20": ("3.15",),
    "2.21": ("3.13", "3.14", "3.15"),
}
ALLOW_ENV = "HYBRIDPAR_ALLOW_UNVERIFIED"

_warned = False


def release_line(version: str) -> str:
    """``"2.21.0"`` -> ``"2.21"``; pre-release and local tags are dropped."""
    major, _, rest = version.partition(".")
    minor = "".join(char for char in rest.split(".")[0] if char.isdigit())
    return f"{major}.{minor}"


def is_supported(tf_version: str, keras_version: str) -> bool:
    """True when the pair's lines are in ``SUPPORTED``."""
    return release_line(keras_version) in SUPPORTED.get(release_line(tf_version), ())


def matrix() -> str:
    """The supported pairs, one phrase: ``TensorFlow 2.19 with Keras 3.15; ...``."""
    return "; ".join(f"TensorFlow {tf_line} with Keras {', '.join(keras_lines)}"
                     for tf_line, keras_lines in SUPPORTED.items())


def unsupported_message(tf_version: str, keras_version: str) -> str:
    """What the gate says about an unsupported pair: installed versions and the matrix."""
    return (f"hybridpar relies on TensorFlow/Keras internals verified on {matrix()}; "
            f"installed: TensorFlow {tf_version}, Keras {keras_version}.")


def installed_versions() -> tuple[str, str]:
    """The installed TensorFlow and Keras versions."""
    import keras
    import tensorflow as tf

    return tf.__version__, keras.__version__


def verified() -> bool:
    """True when the installed TensorFlow and Keras are a supported pair."""
    return is_supported(*installed_versions())


def check_versions() -> None:
    """Refuses TensorFlow/Keras pairs whose internals were not verified.

    Raises:
        RuntimeError: naming the installed versions, the supported matrix and
            ``HYBRIDPAR_ALLOW_UNVERIFIED``, unless that variable is ``1`` (then
            a warning is logged, once per process).
    """
    global _warned
    tf_version, keras_version = installed_versions()
    if is_supported(tf_version, keras_version):
        return
    message = unsupported_message(tf_version, keras_version)
    if os.environ.get(ALLOW_ENV) == "1":
        if not _warned:
            _warned = True
            logger.warning("hybridpar: %s %s=1 is set, so hybridpar goes on; its fixes may "
                           "misbehave on this version.", message, ALLOW_ENV)
        return
    raise RuntimeError(
        f"{message} Install a supported pair (requirements/constraints.txt pins "
        f"TensorFlow 2.21 and Keras 3.15), or set {ALLOW_ENV}=1 to try this version anyway."
    )

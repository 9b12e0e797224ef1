"""Device-name parsing shared by config validation and planning (pure Python)."""

from __future__ import annotations

import re

from hybridpar.errors import ConfigError

_DEVICE_RE = re.compile(
    r"^(?:/job:localhost)?(?:/replica:0)?(?:/task:0)?"
    r"/?(?:device:)?(?P<kind>cpu|gpu|tpu):(?P<index>\d+)$",
    re.IGNORECASE,
)


def canonical_device(name: str) -> str:
    """Returns the canonical local name of a device, e.g. ``/device:GPU:1``.

    Accepts the spellings TensorFlow users write: ``/gpu:1``, ``GPU:1``,
    ``/device:GPU:1`` and the fully qualified
    ``/job:localhost/replica:0/task:0/device:GPU:1``.

    Raises:
        ConfigError: if ``name`` is not a local CPU, GPU or TPU device name.
    """
    match = _DEVICE_RE.match(name.strip()) if isinstance(name, str) else None
    if match is None:
        raise ConfigError(
            f"Not a local device name. Received: device={name!r}. Expected a name "
            'such as "/gpu:0", "GPU:0" or "/device:CPU:1".'
        )
    return f"/device:{match['kind'].upper()}:{int(match['index'])}"


def device_kind(name: str) -> str:
    """Returns ``CPU``, ``GPU`` or ``TPU`` for a device name."""
    return canonical_device(name).split(":")[1]

"""Example models for hybridpar, installed as ``hybridpar_models``.

``get(name)`` returns a model builder by the name a config's ``train.model``
uses.
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from hybridpar.config import did_you_mean
from hybridpar.errors import ConfigError

from .digits import digits_cnn, digits_mlp, digits_transformer
from .recommender import wide_and_deep

MODELS: dict[str, Callable[..., keras.Model]] = {
    "digits_cnn": digits_cnn,
    "digits_mlp": digits_mlp,
    "digits_transformer": digits_transformer,
    "wide_and_deep": wide_and_deep,
}


def get(name: str) -> Callable[..., keras.Model]:
    """The builder registered as ``name``.

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    if name not in MODELS:
        raise ConfigError(
            f"Unknown model. Received: train.model={name!r}.{did_you_mean(name, MODELS)} "
            f"Known models: {', '.join(sorted(MODELS))}."
        )
    return MODELS[name]

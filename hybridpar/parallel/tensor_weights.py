"""A Keras model's weights as the tensor-parallel layout rules see them (``WeightInfo``)."""

from __future__ import annotations

from typing import Any

import keras

from hybridpar.topology.tensor_layout import WeightInfo


def weight_infos(model: keras.Model) -> list[WeightInfo]:
    """Every weight a layer of ``model`` owns, with its layer's and parent's class names.

    The walk follows Keras's own layer tracking (``_layers``), so nested
    blocks (a keras_hub decoder's attention and its projections) are seen
    with the layer that holds them; a weight shared by two layers (a tied
    embedding) is listed once, under the first owner.
    """
    found: list[WeightInfo] = []
    seen: set[int] = set()

    def visit(layer: Any, parent: Any) -> None:
        for weight in getattr(layer, "_trainable_variables", []) + getattr(
                layer, "_non_trainable_variables", []):
            if id(weight) in seen:
                continue
            seen.add(id(weight))
            found.append(WeightInfo(
                path=weight.path, kind=type(layer).__name__,
                shape=tuple(int(d) for d in weight.shape),
                parent_kind=type(parent).__name__ if parent is not None else None))
        for child in getattr(layer, "_layers", []):
            visit(child, layer)

    for layer in getattr(model, "_layers", []):
        visit(layer, None)
    return found

"""The placeable layers of a built Keras model, in topological order, and their static costs.

A unit is a layer the automatic cut places whole: a layer of the trained
model, or of a functional model nested in it (a keras_hub task's backbone is
opened up). The order is the order the functional graph runs its nodes in.
A layer used more than once (a tied embedding: a keras_hub GPT-2's token
embedding embeds the tokens and, reversed, scores the vocabulary) is one
unit with several uses; it is placed at its first use and every use runs on
its stage. Subclassed models have no graph: their ``layers`` in attribute
order stand in for the topological order.

The static cost reads only what the built model records, never running it:
per example, a FLOP estimate (``2 x kernel parameters x output positions``
for Dense, Conv, EinsumDense and their sublayers, plus the score and context
products of attention; a gather for embeddings; a few operations per element
for normalisation and for layers without weights), the bytes of its output
activations, and its parameter bytes (read, updated and written back by the
optimizer each step). Unknown dimensions (``None`` sequence lengths) count
as ``UNKNOWN_DIM``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras

UNKNOWN_DIM = 64
NOMINAL_BATCH = 32  # examples per step the per-step parameter term is weighed against
# FLOP-equivalents of one byte, fitted on 2 CPU cores to the per-layer times of
# benchmarks/partition.py (a 12-block transformer and ResNet50V2 at 32x32): small-batch
# products are memory-bound, so a parameter byte (read forward, read for the activation
# gradient, its gradient written, updated) costs far more than its FLOPs say.
ACTIVATION_BYTE_COST = 32.0
PARAM_BYTE_COST = 128.0
NORMALISATION = (
    keras.layers.BatchNormalization, keras.layers.LayerNormalization,
    keras.layers.GroupNormalization, keras.layers.UnitNormalization,
)


@dataclasses.dataclass
class ModelUnit:
    """One placeable layer and where it is used.

    Attributes:
        layer: the Keras layer.
        uses: the path of layer names of each use (outermost first, the
            trained model left out), with the graph node of that use
            (``None`` for a subclassed model's layer).
        positions: the index of each use among all uses of the model, in
            the order the graph runs them.
    """

    layer: Any
    uses: list[tuple[tuple[str, ...], Any]]
    positions: list[int] = dataclasses.field(default_factory=list)

    @property
    def path(self) -> tuple[str, ...]:
        """The path of its first use, which places it."""
        return self.uses[0][0]

    @property
    def name(self) -> str:
        return "/".join(self.path)


@dataclasses.dataclass(frozen=True)
class StaticCost:
    """What the static model estimates for one unit.

    Attributes:
        flops: forward FLOPs per example, over all its uses.
        activation_bytes: output bytes per example, over all its uses.
        param_bytes: bytes of its parameters.
    """

    flops: float
    activation_bytes: float
    param_bytes: int

    @property
    def cost(self) -> float:
        """The scalar the cut balances: FLOP-equivalents of a ``NOMINAL_BATCH`` step
        (forward and backward: 3x the forward FLOPs and activation bytes)."""
        per_example = 3 * (self.flops + ACTIVATION_BYTE_COST * self.activation_bytes)
        return NOMINAL_BATCH * per_example + PARAM_BYTE_COST * 4 * self.param_bytes


def _graph(layer: Any) -> Any:
    """The functional graph of a functional or Sequential model, or ``None``."""
    if isinstance(layer, keras.Sequential):
        layer = getattr(layer, "_functional", None)
    return layer if getattr(layer, "_nodes_by_depth", None) else None


def model_units(model: keras.Model) -> list[ModelUnit]:
    """The units of ``model`` in the order its graph runs them."""
    units: dict[int, ModelUnit] = {}
    count = [0]

    def visit(graph: Any, prefix: tuple[str, ...]) -> None:
        by_depth = graph._nodes_by_depth
        for depth in sorted(by_depth, reverse=True):
            for node in by_depth[depth]:
                layer = node.operation
                if node.is_input or not isinstance(layer, keras.Layer) or isinstance(
                        layer, keras.layers.InputLayer):
                    continue  # inputs, and plain ops (``x[:, 0]``), which no stage places
                path = (*prefix, layer.name)
                inner = _graph(layer) if isinstance(layer, keras.Model) else None
                if inner is not None:
                    visit(inner, path)
                    continue
                unit = units.setdefault(id(layer), ModelUnit(layer, []))
                unit.uses.append((path, node))
                unit.positions.append(count[0])
                count[0] += 1

    graph = _graph(model)
    if graph is None:
        layers = [la for la in model.layers if not isinstance(la, keras.layers.InputLayer)]
        return [ModelUnit(la, [((la.name,), None)], [i]) for i, la in enumerate(layers)]
    visit(graph, ())
    return list(units.values())


def param_bytes(layer: Any) -> int:
    """Bytes of ``layer``'s variables (its sublayers' included)."""
    return sum(math.prod(w.shape) * _itemsize(w.dtype) for w in layer.weights)


def _itemsize(dtype: Any) -> int:
    name = keras.backend.standardize_dtype(dtype)
    digits = "".join(ch for ch in name if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 1


def _elements(shape: Any) -> tuple[float, float]:
    """(output positions, output elements) per example of a tensor shape."""
    dims = [UNKNOWN_DIM if d is None else d for d in tuple(shape)[1:]]
    if not dims:
        return 1.0, 1.0
    return float(math.prod(dims[:-1])), float(math.prod(dims))


def _leaf_flops(layer: Any, positions: float, elements: float, float_input: bool) -> float:
    own = sum(math.prod(w.shape) for w in layer._trainable_variables)
    if isinstance(layer, keras.layers.Embedding) or "Embedding" in type(layer).__name__:
        return 2.0 * own * positions if float_input else elements
    if isinstance(layer, NORMALISATION):
        return 8.0 * elements
    if isinstance(layer, keras.layers.MultiHeadAttention):
        heads = layer.num_heads
        return 4.0 * positions * positions * heads * layer.key_dim
    kernel = sum(math.prod(w.shape) for w in layer._trainable_variables if len(w.shape) >= 2)
    return 2.0 * kernel * positions if kernel else elements


def _use_flops(layer: Any, node: Any) -> tuple[float, float]:
    """(FLOPs, output bytes) per example of one use of ``layer``."""
    outputs = list(node.outputs) if node is not None else []
    inputs = list(node.input_tensors) if node is not None else []
    shape = outputs[0].shape if outputs else (None, 1)
    positions, elements = _elements(shape)
    float_input = bool(inputs) and "float" in str(inputs[0].dtype)
    out_bytes = sum(_elements(o.shape)[1] * _itemsize(o.dtype) for o in outputs)
    flops = sum(
        _leaf_flops(sub, positions, elements, float_input)
        for sub in layer._flatten_layers(include_self=True, recursive=True)
        if not sub._layers or isinstance(sub, keras.layers.MultiHeadAttention)
    )
    return flops, out_bytes


def static_cost(unit: ModelUnit) -> StaticCost:
    """The static estimate of one unit, summed over its uses."""
    flops = 0.0
    out_bytes = 0.0
    for _, node in unit.uses:
        use_flops, use_bytes = _use_flops(unit.layer, node)
        flops += use_flops
        out_bytes += use_bytes
    return StaticCost(flops=flops, activation_bytes=out_bytes, param_bytes=param_bytes(unit.layer))

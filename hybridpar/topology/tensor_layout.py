"""Which axis of each weight a tensor-parallel group splits (pure Python).

Megatron-style tensor parallelism splits a transformer block's weights over
the ``T`` devices of a group so that each device computes a slice and two
sums per block (attention, MLP) join them:

- a Dense pair of a block (``[d, f]`` then ``[f, d]``): the first is split by
  columns (kernel axis 1, bias axis 0), the second by rows (kernel axis 0,
  its bias whole, added once);
- multi-head attention: the query/key/value projections ``[d, heads, dim]``
  split the heads (kernel axis 1, bias axis 0), the output projection
  ``[heads, dim, d]`` splits them too (kernel axis 0, bias whole);
- a token embedding ``[vocabulary, d]`` splits the vocabulary (axis 0), and an
  untied output projection ``[d, vocabulary]`` splits it on axis 1.

``auto_layout`` finds these on a model's weights described as ``WeightInfo``;
manual rules (regex searched in the variable path -> axis, or ``None`` for
a weight kept whole) override it, in the spirit of Keras's ``LayoutMap``: a
path two rules match, or a rule that matches nothing, is an error, as is a
split that ``T`` does not divide.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from hybridpar.errors import ConfigError

ATTENTION_INPUTS = ("query", "key", "value")
ATTENTION_OUTPUTS = ("attention_output", "output")
EMBEDDING_KINDS = ("Embedding", "ReversibleEmbedding")
_ATTENTION_PARENT = re.compile(r"Attention")


@dataclasses.dataclass(frozen=True)
class WeightInfo:
    """One weight as the layout rules see it.

    Attributes:
        path: the Keras variable path, e.g. ``decoder_0/ffn_in/kernel``.
        kind: the class name of the layer that owns it (``Dense``, ``EinsumDense``...).
        shape: its full shape.
        parent_kind: the class name of the layer that holds the owner, if any.
    """

    path: str
    kind: str
    shape: tuple[int, ...]
    parent_kind: str | None = None

    @property
    def name(self) -> str:
        """The weight's own name: ``kernel``, ``bias``, ``embeddings``..."""
        return self.path.rsplit("/", 1)[-1]

    @property
    def layer(self) -> str:
        """The path of the layer that owns the weight."""
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""

    @property
    def parent(self) -> str:
        """The path of the layer that holds the owner (``""`` at the model's top)."""
        return self.layer.rsplit("/", 1)[0] if "/" in self.layer else ""


@dataclasses.dataclass(frozen=True)
class Split:
    """The axis of a weight a tensor-parallel group splits, and why (for tables and errors)."""

    axis: int
    reason: str


def _attention_splits(weights: Sequence[WeightInfo]) -> dict[str, Split]:
    found: dict[str, Split] = {}
    for weight in weights:
        if weight.kind != "EinsumDense" or not _ATTENTION_PARENT.search(weight.parent_kind or ""):
            continue
        projection = weight.layer.rsplit("/", 1)[-1]
        if projection in ATTENTION_INPUTS:
            axis = {"kernel": 1, "bias": 0}.get(weight.name)
            if axis is not None and len(weight.shape) > axis:
                found[weight.path] = Split(axis, "attention heads")
        elif projection in ATTENTION_OUTPUTS and weight.name == "kernel":
            found[weight.path] = Split(0, "attention heads")
    return found


def _dense_pair_splits(weights: Sequence[WeightInfo]) -> dict[str, Split]:
    """Columns then rows for the Dense layers of one parent that map ``d -> f -> d``, ``f > d``.

    Several expanding layers may feed one contracting layer (Llama's gate and
    up projections): each is split by columns.
    """
    found: dict[str, Split] = {}
    by_parent: dict[str, list[WeightInfo]] = {}
    for weight in weights:
        if weight.kind == "Dense" and weight.name == "kernel" and len(weight.shape) == 2:
            by_parent.setdefault(weight.parent, []).append(weight)
    for siblings in by_parent.values():
        shapes = {kernel.shape for kernel in siblings}
        for kernel in siblings:
            inner, outer = kernel.shape
            if (outer, inner) not in shapes:
                continue
            if inner < outer:
                found[kernel.path] = Split(1, "MLP columns")
                found[f"{kernel.layer}/bias"] = Split(0, "MLP columns")
            elif inner > outer:
                found[kernel.path] = Split(0, "MLP rows")
    return found


def _embedding_splits(weights: Sequence[WeightInfo]) -> dict[str, Split]:
    found: dict[str, Split] = {}
    for weight in weights:
        if weight.kind not in EMBEDDING_KINDS:
            continue
        token = weight.kind == "ReversibleEmbedding" or "token" in weight.layer
        if not token:
            continue
        if weight.name == "embeddings":
            found[weight.path] = Split(0, "vocabulary")
        elif weight.name == "reverse_embeddings":
            found[weight.path] = Split(1, "vocabulary")
    return found


def auto_layout(weights: Sequence[WeightInfo]) -> dict[str, Split]:
    """The Megatron splits of ``weights``: attention heads, Dense pairs, token embeddings.

    Weights none of the rules names (layer norms, position embeddings, a row
    layer's bias, layers outside transformer blocks) stay whole on every
    device of the group.
    """
    present = {weight.path for weight in weights}
    found = {**_dense_pair_splits(weights), **_attention_splits(weights),
             **_embedding_splits(weights)}
    return {path: split for path, split in found.items() if path in present}


def manual_layout(rules: Mapping[str, int | None],
                  weights: Sequence[WeightInfo]) -> dict[str, Split | None]:
    """What the manual rules say of each weight they match (``None``: kept whole).

    Raises:
        ConfigError: for a rule that is no valid regex or matches no weight, a
            path two rules match, or an axis the weight does not have.
    """
    matched: dict[str, Split | None] = {}
    used: dict[str, str] = {}
    for weight in weights:
        hits = [pattern for pattern in rules if _search(pattern, weight.path)]
        if len(hits) > 1:
            raise ConfigError(
                f"model_parallel.tensor_layout: variable {weight.path!r} matches more than "
                f"one rule: {', '.join(map(repr, hits))}. Make the rules exclusive (anchor "
                "them, e.g. '/query/kernel$')."
            )
        if not hits:
            continue
        axis = rules[hits[0]]
        used[hits[0]] = weight.path
        if axis is None:
            matched[weight.path] = None
            continue
        if not -len(weight.shape) <= axis < len(weight.shape):
            raise ConfigError(
                f"model_parallel.tensor_layout[{hits[0]!r}] splits axis {axis} of "
                f"{weight.path!r}, whose shape {list(weight.shape)} has "
                f"{len(weight.shape)} axes. Use an axis in 0..{len(weight.shape) - 1}, or "
                "null to keep it whole."
            )
        matched[weight.path] = Split(axis % len(weight.shape), "rule")
    _check_all_used(rules, used, weights)
    return matched


def _search(pattern: str, path: str) -> bool:
    try:
        return re.search(pattern, path) is not None
    except re.error as err:
        raise ConfigError(
            f"model_parallel.tensor_layout key is not a valid regular expression ({err}). "
            f"Received: {pattern!r}."
        ) from None


def _check_all_used(rules: Iterable[str], used: Mapping[str, str],
                    weights: Sequence[WeightInfo]) -> None:
    unused = [pattern for pattern in rules if pattern not in used]
    if not unused:
        return
    examples = ", ".join(repr(w.path) for w in weights[:4])
    raise ConfigError(
        f"model_parallel.tensor_layout rule {unused[0]!r} matches no variable of the "
        f"model. Rules are searched in variable paths such as {examples}. Fix the rule "
        "or remove it."
    )


def resolve_layout(size: int, weights: Sequence[WeightInfo], rules: Mapping[str, int | None],
                   auto: bool) -> dict[str, Split]:
    """The split of every weight a group of ``size`` devices divides, checked.

    Args:
        size: devices per tensor-parallel group (``model_parallel.tensor``).
        weights: the model's weights.
        rules: manual rules, regex -> axis (``None`` keeps a weight whole).
        auto: whether the automatic rules place the weights no manual rule names.

    Raises:
        ConfigError: for a rule as ``manual_layout`` says, or a split that
            ``size`` does not divide (heads, vocabulary, units).
    """
    layout = auto_layout(weights) if auto else {}
    for path, split in manual_layout(rules, weights).items():
        if split is None:
            layout.pop(path, None)
        else:
            layout[path] = split
    shapes = {weight.path: weight.shape for weight in weights}
    for path, split in layout.items():
        _check_divides(size, path, shapes[path], split)
    return layout


def _check_divides(size: int, path: str, shape: tuple[int, ...], split: Split) -> None:
    extent = shape[split.axis]
    if extent % size == 0:
        return
    divisors = [t for t in range(1, extent + 1) if extent % t == 0 and t <= 64]
    raise ConfigError(
        f"model_parallel.tensor={size} does not divide the {split.reason} of {path!r}: "
        f"axis {split.axis} of shape {list(shape)} has {extent}. Use a tensor size that "
        f"divides {extent} (e.g. {', '.join(map(str, divisors[-3:]))}), or keep the weight "
        f"whole with model_parallel.tensor_layout: {{{re.escape(path)!r}: null}}."
    )


def check_group(size: int, stages: int, devices: int) -> None:
    """Raises ConfigError unless ``stages x size`` devices make whole replicas of ``devices``.

    Args:
        size: devices per tensor-parallel group.
        stages: pipeline stages per replica.
        devices: devices this process trains on.
    """
    per_replica = size * stages
    if devices % per_replica:
        raise ConfigError(
            f"model_parallel.tensor={size} x model_parallel.stages={stages} = {per_replica} "
            f"devices per replica does not divide the {devices} devices here. Use a tensor "
            f"size and stage count whose product divides {devices}, or list "
            "data_parallel.devices."
        )

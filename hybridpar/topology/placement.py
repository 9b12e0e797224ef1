"""Which model-parallel stage each layer belongs to (pure Python).

A layer's stage comes from, in order:

1. ``with hybridpar.stage(k):`` around the layer's construction;
2. ``model_parallel.placement``: regexes searched (``re.search``) in the layer
   name, each mapped to a stage index.

Nested layers follow their outermost placed ancestor: when a block matches a
rule, every layer inside it runs on the block's stage whatever its own name
says. A layer that neither it nor any ancestor places goes to stage 0.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from hybridpar.errors import ConfigError


class _StageContext(threading.local):
    def __init__(self) -> None:
        self.stack: list[int] = []


_context = _StageContext()

# A layer on a path: its name and the ``stage()`` index it was built under.
PathEntry = tuple[str, int | None]


@contextlib.contextmanager
def stage(index: int) -> Iterator[int]:
    """Marks layers constructed inside the block for stage ``index`` (pure part
    of ``hybridpar.stage``, which also installs the Keras hook that records it).

    Raises:
        ConfigError: if ``index`` is not an integer >= 0.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(
            f"hybridpar.stage() takes a stage index >= 0. Received: index={index!r}."
        )
    _context.stack.append(index)
    try:
        yield index
    finally:
        _context.stack.pop()


def current_stage() -> int | None:
    """The innermost ``hybridpar.stage()`` index, or ``None`` outside any."""
    return _context.stack[-1] if _context.stack else None


def record_layer(layer: Any) -> None:
    """Marks a layer constructed inside ``stage(k)`` with ``_hybridpar_stage = k``."""
    index = current_stage()
    if index is not None:
        object.__setattr__(layer, "_hybridpar_stage", index)


def path_entry(layer: Any) -> PathEntry:
    """A layer as ``(name, stage() index or None)``."""
    return layer.name, getattr(layer, "_hybridpar_stage", None)


class PlacementRules:
    """``model_parallel.placement``: regex -> stage, checked against the stages.

    Args:
        placement: regexes searched in layer names, each to a stage index.
        stages: model-parallel stages per replica.
    """

    def __init__(self, placement: Mapping[str, int], stages: int) -> None:
        self.stages = stages
        self.placement = dict(placement)
        self._compiled = [(pattern, re.compile(pattern)) for pattern in placement]
        self.assigned: dict[tuple[str, ...], int] = {}

    def assign(self, stages: Mapping[tuple[str, ...], int]) -> None:
        """Records the automatic cut: path of layer names -> stage.

        Raises:
            ConfigError: for a stage index outside ``0..stages-1``.
        """
        for path, index in stages.items():
            if not 0 <= index < self.stages:
                raise ConfigError(
                    f"Layer {'/'.join(path)!r} is cut onto stage {index}, but "
                    f"model_parallel.stages={self.stages} allows 0..{self.stages - 1}."
                )
        self.assigned.update(stages)

    def assigned_stage(self, path: Sequence[PathEntry]) -> int | None:
        """The stage the automatic cut gives the layer at the end of ``path``, if any."""
        return self.assigned.get(tuple(name for name, _ in path))

    def rule_for(self, name: str) -> str | None:
        """The rule (regex) that matches the layer ``name``, or ``None``.

        Raises:
            ConfigError: if two rules match ``name``.
        """
        matched = [pattern for pattern, regex in self._compiled if regex.search(name)]
        if len(matched) > 1:
            raise ConfigError(
                f"Layer {name!r} is matched by {len(matched)} model_parallel.placement rules: "
                f"{', '.join(repr(p) for p in matched)}. Each layer may match one rule; make "
                "the patterns more specific (e.g. anchor them with ^ and $)."
            )
        return matched[0] if matched else None

    def rule_stage(self, name: str) -> int | None:
        """The stage the rules give the layer ``name``, or ``None`` if none matches."""
        pattern = self.rule_for(name)
        return None if pattern is None else self.placement[pattern]

    def own_stage(self, entry: PathEntry) -> int | None:
        """The stage ``stage()`` or the rules give a layer itself.

        Raises:
            ConfigError: for a stage index outside ``0..stages-1``, or a layer
                matched by two rules.
        """
        name, index = entry
        source = "hybridpar.stage()"
        if index is None:
            index = self.rule_stage(name)
            source = "model_parallel.placement"
        if index is not None and index >= self.stages:
            raise ConfigError(
                f"Layer {name!r} is placed on stage {index} by {source}, but "
                f"model_parallel.stages={self.stages} allows stages 0..{self.stages - 1}. "
                "Fix the index or raise model_parallel.stages."
            )
        return index

    def resolve(self, path: Sequence[PathEntry]) -> int | None:
        """The stage of the layer at the end of ``path`` (outermost layer first).

        The outermost placed layer on the path decides; ``None`` when no layer
        on it is placed (the caller then uses stage 0). Marks and rules come
        before the automatic cut at each depth.
        """
        path = tuple(path)
        for depth, entry in enumerate(path):
            index = self.own_stage(entry)
            if index is None:
                index = self.assigned_stage(path[: depth + 1])
            if index is not None:
                return index
        return None

    def check_layers(
        self, paths: Iterable[Sequence[PathEntry]]
    ) -> list[tuple[PathEntry, ...]]:
        """Checks the rules against every layer of a model.

        Args:
            paths: for each layer, the entries from its outermost enclosing
                layer (below the model) down to the layer itself.

        Returns:
            The paths that nothing places (those layers go to stage 0).

        Raises:
            ConfigError: for a rule that matches no layer, a layer matched by
                two rules, or a stage index out of range.
        """
        paths = [tuple(path) for path in paths]
        names = list(dict.fromkeys(path[-1][0] for path in paths))
        unused = [
            pattern
            for pattern, regex in self._compiled
            if not any(regex.search(name) for name in names)
        ]
        if unused:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(
                f"model_parallel.placement rule(s) {', '.join(repr(p) for p in unused)} match "
                f"no layer of the model. Layer names: {shown}. Fix or remove the rule(s)."
            )
        return [path for path in paths if self.resolve(path) is None]

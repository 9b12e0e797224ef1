"""The typed-dataclass engine behind every config section (pure Python).

A section is a frozen dataclass deriving from ``Section``: its fields are
type-checked and normalised in ``__post_init__`` (``coerce``), then the
section's own ``validate()`` runs. Mappings become sections through
``build_section``, which refuses unknown keys with a did-you-mean; dotted
overrides (``set_dotted``) and YAML line lookup (``line_of_error``) work on
any tree of sections.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import yaml

from hybridpar.errors import ConfigError


def did_you_mean(received: str, candidates: typing.Iterable[str]) -> str:
    """Returns ``' Did you mean "x"?'`` for the closest candidate, or ``''``."""
    close = difflib.get_close_matches(received, list(candidates), n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""


def type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return "a list of " + {str: "strings", int: "integers"}.get(item, type_name(item))
    if origin is dict:
        key, value = typing.get_args(hint)
        return f"a mapping of {type_name(key)} to {type_name(value)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _is_a(value: Any, scalar: type) -> bool:
    if isinstance(value, bool):
        return scalar is bool
    if scalar is float:
        return isinstance(value, (int, float))
    return isinstance(value, scalar)


def _type_error(path: str, value: Any, hint: Any) -> ConfigError:
    return ConfigError(
        f"{path} must be {type_name(hint)}. "
        f"Received: {path}={value!r} ({type(value).__name__})."
    )


def _coerce_union(value: Any, hint: Any, path: str) -> Any:
    """``coerce`` for an optional or alternative type, such as ``int | None``."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    inners = [a for a in args if a is not type(None)]
    if len(inners) > 1:  # e.g. ``int | str``: the first alternative that fits
        for inner in inners:
            try:
                return coerce(value, inner, path)
            except ConfigError:
                continue
        raise _type_error(path, value, hint)
    (inner,) = inners
    containers = {tuple: (list, tuple), dict: Mapping}
    expected = containers.get(typing.get_origin(inner))
    if (
        value is None
        or (inner in (int, float, str, bool) and not _is_a(value, inner))
        or (expected is not None and not isinstance(value, expected))
    ):
        raise _type_error(path, value, hint)
    return coerce(value, inner, path)


def coerce(value: Any, hint: Any, path: str) -> Any:
    """Checks ``value`` against the type ``hint`` and normalises it.

    Lists become tuples, mappings become sections or plain dicts, integers
    are accepted where a float is expected. Nothing else is converted:
    ``"3"`` is not an integer.
    """
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            return build_section(hint, value, path)
        raise _type_error(path, value, hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, path)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            hint_text = did_you_mean(value, allowed) if isinstance(value, str) else ""
            raise ConfigError(
                f"{path} must be one of {', '.join(map(repr, allowed))}. "
                f"Received: {path}={value!r}.{hint_text}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _type_error(path, value, hint)
        (item_hint, _) = typing.get_args(hint)
        return tuple(coerce(v, item_hint, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _type_error(path, value, hint)
        key_hint, value_hint = typing.get_args(hint)
        return {
            coerce(k, key_hint, f"{path} key"): coerce(v, value_hint, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    if hint in (bool, int, float, str):
        if not _is_a(value, hint):
            raise _type_error(path, value, hint)
        return float(value) if hint is float else value
    raise TypeError(f"Unsupported config type {hint!r} at {path}.")


def build_section(cls: type, data: Mapping[str, Any], path: str) -> Any:
    """Builds section ``cls`` from a mapping, refusing unknown keys."""
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            full = f"{path}.{key}" if path else str(key)
            prefix = f"{path}." if path else ""
            suggestion = did_you_mean(full, [prefix + name for name in names])
            raise ConfigError(
                f'Unknown config key "{full}".{suggestion} '
                f"Valid keys{' in ' + repr(path) if path else ''}: {', '.join(names)}.",
            )
    return cls(**dict(data))


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def positive(path: str, value: int | float | None) -> None:
    require(
        value is None or value >= 1,
        f"{path} must be >= 1 (or null where allowed). Received: {path}={value!r}.",
    )


class Section:
    """Base of every config section: type checks in ``__post_init__``."""

    PATH: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            path = f"{self.PATH}.{field.name}" if self.PATH else field.name
            value = coerce(getattr(self, field.name), hints[field.name], path)
            object.__setattr__(self, field.name, value)
        self.validate()

    def validate(self) -> None:
        """Range checks of this section alone (cross-field rules live higher)."""

    def to_dict(self) -> dict[str, Any]:
        """Returns plain YAML-able data (lists, dicts, scalars)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value



def section_fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def section_type(hint: Any) -> type | None:
    """The section class behind a hint such as ``PartitionerConfig | None``."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def dotted_keys(cls: type, prefix: str) -> list[str]:
    keys = []
    for name, hint in section_fields(cls).items():
        dotted = f"{prefix}{name}"
        section = section_type(hint)
        keys.extend(dotted_keys(section, dotted + ".") if section else [dotted])
    return keys


def set_dotted(
    tree: dict[str, Any], cls: type, dotted: str, value: Any, root: type | None = None
) -> None:
    """Sets the dotted key ``dotted`` of ``tree`` (plain data of section ``cls``).

    Raises:
        ConfigError: for a key that ``cls`` does not have, with a did-you-mean
            among the keys of ``root`` (default: ``cls``).
    """
    root = root or cls
    parts = dotted.split(".")
    node, section = tree, cls
    for depth, part in enumerate(parts):
        fields = section_fields(section)
        if part not in fields:
            known = dotted_keys(root, "") + [f.name for f in dataclasses.fields(root)]
            raise ConfigError(
                f'Unknown config key "{dotted}".{did_you_mean(dotted, known)} '
                f"Valid keys at this level: {', '.join(fields)}."
            )
        inner = section_type(fields[part])
        last = depth == len(parts) - 1
        if last:
            if inner is not None and isinstance(value, Mapping) and node.get(part) is not None:
                for key, sub_value in value.items():
                    set_dotted(node[part], inner, str(key), sub_value, root)
            else:
                node[part] = value
            return
        if inner is None:
            raise ConfigError(
                f'Config key "{".".join(parts[: depth + 1])}" is a value, not a section, so '
                f'"{dotted}" does not exist.'
            )
        if node.get(part) is None:
            node[part] = {}
        node, section = node[part], inner


def line_of_error(text: str, message: str) -> int | None:
    """Finds the YAML line of the key an error message names, if any."""
    match = re.search(r'"([\w.]+)"|\b((?:[a-z_]+\.)+[a-z_]+)\b', message)
    if not match:
        return None
    parts = (match.group(1) or match.group(2)).split(".")
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in parts:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == part:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            break
    return line

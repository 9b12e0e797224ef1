"""The configuration reference, read from the sections themselves (pure Python).

Every key's type and default come from the section dataclasses, and its
description from the ``Attributes:`` block of the section's docstring, so the
reference in the documentation (``docs/configuration.md``, rendered by
``docs/hooks.py``) cannot drift from what ``StrategyConfig`` accepts.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from hybridpar.config.engine import section_fields, section_type, type_name
from hybridpar.config.strategy import StrategyConfig

_ATTRIBUTE = re.compile(r"^(\w+):\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class ReferenceRow:
    """One key of the configuration.

    Attributes:
        key: the dotted key, such as ``data_parallel.mode``.
        type: what the key accepts, in words (``'auto' | 'none'``, ``an integer``).
        default: the default as YAML would spell it.
        description: the sentence from the section's ``Attributes:`` block.
    """

    key: str
    type: str
    default: str
    description: str


def field_descriptions(section: type) -> dict[str, str]:
    """The ``Attributes:`` entries of ``section``'s docstring, one line each."""
    lines = inspect.cleandoc(section.__doc__ or "").splitlines()
    descriptions: dict[str, str] = {}
    inside, current = False, None
    for line in lines:
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break  # the block ended: a new heading or paragraph
        match = _ATTRIBUTE.match(line.strip())
        indent = len(line) - len(line.lstrip())
        if match and indent <= 4:
            current = match.group(1)
            descriptions[current] = match.group(2)
        elif current and line.strip():
            descriptions[current] += " " + line.strip()
    return descriptions


def _yaml_default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    return str(value)


def reference_rows(section: type = StrategyConfig, prefix: str = "") -> list[ReferenceRow]:
    """Every key of ``section`` and of the sections below it, in declaration order.

    Raises:
        ValueError: when a key has no entry in its section's ``Attributes:``
            block (a key the reference could not explain).
    """
    descriptions = field_descriptions(section)
    hints = section_fields(section)
    rows = []
    for field in dataclasses.fields(section):
        key = f"{prefix}{field.name}"
        below = section_type(hints[field.name])
        optional = below is not None and field.default is None
        if below is None or optional:
            if field.name not in descriptions:
                raise ValueError(
                    f"config key {key!r} has no entry in the Attributes: block of "
                    f"{section.__name__}'s docstring; document it there."
                )
            rows.append(ReferenceRow(key, type_name(hints[field.name]), _yaml_default(field),
                                     descriptions[field.name]))
        if below is not None:
            rows.extend(reference_rows(below, key + "."))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_reference(section: type = StrategyConfig) -> str:
    """One Markdown table per top-level section: key, type, default, meaning."""
    parts = []
    hints = section_fields(section)
    for field in dataclasses.fields(section):
        below = section_type(hints[field.name])
        if below is None:
            continue
        summary = inspect.cleandoc(below.__doc__ or "").splitlines()[0]
        parts.append(f"## `{field.name}`\n\n{summary}\n")
        parts.append("| key | accepts | default | meaning |\n|---|---|---|---|")
        for row in reference_rows(below, field.name + "."):
            parts.append(f"| `{row.key}` | {_cell(row.type)} | `{_cell(row.default)}` "
                         f"| {_cell(row.description)} |")
        parts.append("")
    return "\n".join(parts)


"""Every fix's record as one Markdown table: the documentation's list of fixes.

The site's fixes page is generated from the records (``docs/hooks.py``), so it
lists exactly the fixes ``hybridpar.compat.known()`` registers. Pure: it reads
``Fix`` records and imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridpar.compat.patching import Fix


def _qualified(owner: object) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))


def _how(fix: Fix) -> str:
    if fix.part_of:
        return f"in `{fix.part_of}`'s patch"
    if not fix.patches:
        return "hybridpar's own strategy classes and collectives"
    return ", ".join(f"`{_qualified(patch.owner)}.{patch.name}`" for patch in fix.patches)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(fixes: Iterable[Fix]) -> str:
    """One row per fix: name, what upstream does, the upstream issue, when, what it replaces."""
    rows = ["| fix | what upstream does | upstream issue | installed while | replaces |",
            "|---|---|---|---|---|"]
    rows += [f"| `{fix.name}` | {_cell(fix.corrects)} | {fix.upstream or '-'} | `{fix.group}` "
             f"| {_cell(_how(fix))} |" for fix in fixes]
    return "\n".join(rows)

"""Reversible patches of Keras/TensorFlow attributes, installed by group while needed.

A ``Fix`` names the upstream behaviour it corrects and lists its ``Patch``es.
Fixes belong to a group, and a group is installed while something holds it:

- ``core``: while any strategy hybridpar built is alive;
- ``stages``: while a strategy with ``model_parallel.stages > 1`` is alive;
- ``stage_marks``: while a ``hybridpar.stage()`` block is open;
- ``parameter_server``: while a parameter-server strategy hybridpar built is alive;
- ``split_weights``: while a strategy whose weights may be stored in shards is
  alive (parameter servers' partitioned variables, tensor-parallel groups).

Every patched function asks first whether the object at hand belongs to
hybridpar and otherwise calls the original with the same arguments, so code
that never asked for hybridpar runs Keras's own path. A patch says so with
``owns`` (who it acts on) and ``wrap`` (what it does for them); ``guarded``
builds the replacement. ``uninstall()`` puts every original object back,
whatever holds a group.

One fix owns each attribute: ``register`` refuses a fix that patches an
attribute another registered fix patches. Behaviours of several fixes on one
attribute are composed in the owner's patch (``compose``) in a stated order,
and the others name it in ``part_of``; so installing and reverting never
depend on the order in which fixes (or groups) come and go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("hybridpar")

GROUPS = ("core", "stages", "stage_marks", "parameter_server", "split_weights")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Patch:
    """Replaces ``owner.<name>`` by ``wrap(original)``.

    Attributes:
        owner: the class or module whose attribute is replaced.
        name: the attribute.
        wrap: builds the replacement from the original. It receives the raw
            attribute from ``owner.__dict__`` (a function, ``staticmethod``
            or ``property``) when it is defined there, else the inherited
            value.
        after: called with the value now in place, after installing (with
            the replacement) and after uninstalling (with the original), for
            attributes that must also be registered elsewhere.
        owns: who the patch acts on, called with the arguments of each call.
            When given, ``wrap(original)`` is what owned calls run, and every
            other call runs the original with the same arguments (see
            ``guarded``); the attribute must then be a plain function.
    """

    owner: Any
    name: str
    wrap: Callable[[Any], Any]
    after: Callable[[Any], None] | None = None
    owns: Callable[..., bool] | None = None

    def replacement(self, original: Any) -> Any:
        """What ``owner.<name>`` becomes, built from the value in place now."""
        if self.owns is None:
            return self.wrap(original)
        return guarded(self.wrap, self.owns)(original)


def guarded(wrap: Callable[[Any], Any], owns: Callable[..., bool]) -> Callable[[Any], Any]:
    """``wrap`` acting only on what ``owns`` accepts: elsewhere the original, same arguments.

    The replacement calls ``owns(*args, **kwargs)`` first; when it is false it
    returns ``original(*args, **kwargs)`` unchanged, so callers that are not
    hybridpar's run the original exactly. Usable inside a ``wrap`` that
    composes several behaviours on one attribute.
    """

    def build(original: Any) -> Any:
        if isinstance(original, (staticmethod, classmethod, property)):
            raise TypeError(f"guarded() wraps plain functions. Received: {original!r}.")
        owned = wrap(original)

        @functools.wraps(original)
        def replacement(*args: Any, **kwargs: Any) -> Any:
            if owns(*args, **kwargs):
                return owned(*args, **kwargs)
            return original(*args, **kwargs)

        return replacement

    return build


def compose(*wraps: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One wrap made of ``wraps``; a call runs them in the order given, the first outermost."""

    def build(original: Any) -> Any:
        for wrap in reversed(wraps):
            original = wrap(original)
        return original

    return build


@dataclasses.dataclass(frozen=True)
class Fix:
    """One correction of an upstream Keras/TensorFlow behaviour.

    Attributes:
        name: short identifier, e.g. ``symbolic_build``.
        corrects: what upstream does wrong, in one sentence.
        upstream: the upstream issue, where one exists.
        group: when it is installed (see the module docstring).
        patches: the attributes it replaces; empty for fixes that are
            overrides in hybridpar's own strategy classes, and for fixes
            that act through another fix's patch.
        part_of: the fix whose patch runs this one's behaviour, when that
            fix owns the attribute both need (same group).
    """

    name: str
    corrects: str
    group: str
    patches: tuple[Patch, ...] = ()
    upstream: str = ""
    part_of: str = ""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"Fix {self.name!r}: unknown group {self.group!r}.")
        if self.part_of and self.patches:
            raise ValueError(f"Fix {self.name!r} is part of {self.part_of!r}'s patch, so it "
                             "patches nothing itself. Received: patches of "
                             f"{', '.join(p.name for p in self.patches)}.")


@dataclasses.dataclass
class _Applied:
    patch: Patch
    original: Any  # the raw value in owner.__dict__, or _MISSING if inherited


class _Registry:
    """Which fixes exist, which are applied, and who holds each group."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._fixes: dict[str, Fix] = {}
        self._applied: dict[str, list[_Applied]] = {}
        self._holds = dict.fromkeys(GROUPS, 0)
        self.generation = 0  # holds taken before an uninstall() release nothing

    def register(self, fix: Fix) -> Fix:
        with self._lock:
            if fix.name in self._fixes and self._fixes[fix.name] is not fix:
                raise ValueError(f"Two fixes are named {fix.name!r}.")
            self._check_one_owner(fix)
            self._fixes[fix.name] = fix
            if self._holds[fix.group] and fix.name not in self._applied:
                self._apply(fix)
        return fix

    def _check_one_owner(self, fix: Fix) -> None:
        """Raises ValueError when ``fix`` patches an attribute that a registered fix patches."""
        owners = {(id(patch.owner), patch.name): other.name
                  for other in self._fixes.values() if other.name != fix.name
                  for patch in other.patches}
        for patch in fix.patches:
            key = (id(patch.owner), patch.name)
            if key in owners:
                raise ValueError(
                    f"Fixes {owners[key]!r} and {fix.name!r} both patch "
                    f"{_qualified(patch.owner)}.{patch.name}. One fix owns each attribute: "
                    f"compose the behaviours in {owners[key]!r}'s patch and make "
                    f"{fix.name!r} part_of it."
                )
            owners[key] = fix.name

    def fixes(self) -> list[Fix]:
        with self._lock:
            return list(self._fixes.values())

    def installed(self) -> list[Fix]:
        with self._lock:
            return [self._fixes[name] for name in self._applied if self._fixes[name].patches]

    def is_installed(self, fix: Fix) -> bool:
        with self._lock:
            return fix.name in self._applied

    def acquire(self, group: str) -> int:
        with self._lock:
            self._holds[group] += 1
            if self._holds[group] == 1:
                for fix in self._fixes.values():
                    if fix.group == group and fix.name not in self._applied:
                        self._apply(fix)
            return self.generation

    def release(self, group: str, generation: int) -> None:
        with self._lock:
            if generation != self.generation or self._holds[group] == 0:
                return
            self._holds[group] -= 1
            if self._holds[group] == 0:
                for name in reversed(list(self._applied)):
                    if self._fixes[name].group == group:
                        self._revert(name)

    def uninstall(self) -> None:
        with self._lock:
            for name in reversed(list(self._applied)):
                self._revert(name)
            self._holds = dict.fromkeys(GROUPS, 0)
            self.generation += 1

    def _apply(self, fix: Fix) -> None:
        applied = []
        for patch in fix.patches:
            raw = vars(patch.owner).get(patch.name, _MISSING)
            current = raw if raw is not _MISSING else getattr(patch.owner, patch.name)
            replacement = patch.replacement(current)
            setattr(patch.owner, patch.name, replacement)
            if patch.after is not None:
                patch.after(getattr(patch.owner, patch.name))
            applied.append(_Applied(patch, raw))
        self._applied[fix.name] = applied
        logger.debug("hybridpar: installed Keras/TF fix %s", fix.name)

    def _revert(self, name: str) -> None:
        for applied in reversed(self._applied.pop(name)):
            patch = applied.patch
            if applied.original is _MISSING:
                delattr(patch.owner, patch.name)
            else:
                setattr(patch.owner, patch.name, applied.original)
            if patch.after is not None:
                patch.after(getattr(patch.owner, patch.name))
        logger.debug("hybridpar: removed Keras/TF fix %s", name)


def _qualified(owner: Any) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", repr(owner))


_registry = _Registry()


def register(fix: Fix) -> Fix:
    """Makes ``fix`` known; it is applied whenever its group is held."""
    return _registry.register(fix)


def hold(group: str, owner: Any) -> None:
    """Installs ``group`` until ``owner`` is garbage-collected."""
    generation = _registry.acquire(group)
    weakref.finalize(owner, _registry.release, group, generation)


@contextlib.contextmanager
def holding(group: str) -> Iterator[None]:
    """Installs ``group`` for the duration of the block."""
    generation = _registry.acquire(group)
    try:
        yield
    finally:
        _registry.release(group, generation)


def installed() -> list[Fix]:
    """The fixes whose patches are in place now, in the order they were applied."""
    return _registry.installed()


def is_installed(fix: Fix) -> bool:
    """True while ``fix``'s patches are in place."""
    return _registry.is_installed(fix)


def known() -> list[Fix]:
    """Every fix hybridpar has, installed or not."""
    return _registry.fixes()


def uninstall() -> None:
    """Restores every original Keras/TensorFlow attribute hybridpar replaced.

    Strategies built afterwards install their fixes again; strategies and
    models built before keep working only through what their own classes
    override (their Keras-level fixes are gone).
    """
    _registry.uninstall()

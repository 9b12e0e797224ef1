"""Which part of a replica's batch the output losses computed now stand for.

Keras records each output's loss once per call of its ``CompileLoss``
(``hybridpar.compat.replica_share`` weights those records by the examples they
cover). A microbatched step computes the loss once per microbatch, so it says
here how many examples each call covers and how many calls a batch makes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

_record: contextvars.ContextVar[tuple[Any, int] | None] = contextvars.ContextVar(
    "hybridpar_output_record", default=None
)


@contextlib.contextmanager
def covering(examples: Any, records: int) -> Iterator[None]:
    """Output losses computed inside cover ``examples`` examples (``None``: the replica's
    whole batch), one of ``records`` calls per replica and batch."""
    token = _record.set((examples, records))
    try:
        yield
    finally:
        _record.reset(token)


def current() -> tuple[Any, int] | None:
    """``(examples, records)`` of the output losses being computed, or ``None``."""
    return _record.get()

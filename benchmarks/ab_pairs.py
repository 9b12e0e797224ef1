"""Interleaved A/B runs shared by the benchmarks: hybridpar against raw TensorFlow."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

VARIANTS = ("hybridpar", "raw")


def pair_orders(pairs: int) -> list[tuple[str, str]]:
    """Run order per pair: ``hybridpar`` first in even pairs, ``raw`` first in odd ones."""
    return [VARIANTS if i % 2 == 0 else VARIANTS[::-1] for i in range(pairs)]


def summarize(pairs: Sequence[dict[str, float]]) -> tuple[float, float, float]:
    """Median over pairs of each variant's step time, and their ratio hybridpar/raw."""
    hybrid = statistics.median(p["hybridpar"] for p in pairs)
    raw = statistics.median(p["raw"] for p in pairs)
    return hybrid, raw, hybrid / raw


def parse_child_output(stdout: str) -> dict[str, Any]:
    """The last JSON object line a child process printed.

    Raises:
        ValueError: if the child printed no JSON object line.
    """
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise ValueError(f"Child printed no JSON result line. Received stdout: {stdout[-500:]!r}")

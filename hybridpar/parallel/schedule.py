"""Pipeline schedules: the GPipe bound, the 1F1B order, and recorded timelines (pure Python).

A timeline is a list of ``Interval`` records, one per (step, microbatch,
stage, phase), in seconds. It is written as a Chrome trace (open it in
``chrome://tracing`` or https://ui.perfetto.dev; one row per stage) and as a
PNG with the stages as rows, so the pipeline bubble is visible.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence

PHASES = ("forward", "backward")
# TensorFlow makes re-entered name scopes unique with a suffix (hybridpar_stage0_1).
_STAGED_OP = re.compile(
    r"(?:^|/)(?:microbatch(\d+)(?:_\d+)?/(?:.*/)?)?hybridpar_stage(\d+)(?:_\d+)?/"
)
# Ops that move or read state rather than compute: they run whenever their
# (non-data) inputs are ready, e.g. a stage's weight reads at the start of a
# step, and would stretch the stage's interval over time it does not work.
BOOKKEEPING_OPS = frozenset((
    "ReadVariableOp", "Const", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size",
    "Rank", "_Send", "_Recv", "_HostSend", "_HostRecv",
))


def gpipe_speedup_bound(microbatches: int, stages: int) -> float:
    """The best speedup of ``stages`` equal stages over unsplit execution:
    ``M * K / (M + K - 1)`` (GPipe, arXiv 1811.06965; the idle share is
    ``(K - 1) / (M + K - 1)``)."""
    return microbatches * stages / (microbatches + stages - 1)


def bubble_fraction(microbatches: int, stages: int) -> float:
    """The share of each device's time idle in a GPipe step of equal stages."""
    return (stages - 1) / (microbatches + stages - 1)


def one_f_one_b_order(microbatches: int, stages: int) -> list[list[tuple[str, int]]]:
    """Each stage's work in 1F1B (PipeDream-flush, arXiv 2006.09503) order.

    Stage ``k`` runs ``stages - k`` warm-up forwards, then alternates one
    backward and one forward, then drains the backwards, so it never holds
    more than ``stages - k`` microbatches' activations.

    Returns:
        Per stage, ``("F", m)`` and ``("B", m)`` in the order they run.
    """
    orders = []
    for stage in range(stages):
        warmup = min(stages - stage, microbatches)
        order = [("F", m) for m in range(warmup)]
        for m in range(microbatches):
            order.append(("B", m))
            if m + warmup < microbatches:
                order.append(("F", m + warmup))
        orders.append(order)
    return orders


def forward_waits_for(microbatch: int, stage: int, stages: int) -> int | None:
    """The microbatch whose backward on ``stage`` the forward of ``microbatch``
    there waits for under 1F1B (``None``: a warm-up forward waits for nothing).

    It is the constraint that bounds the stage's activations: at most
    ``stages - stage`` microbatches are between their forward and backward.
    """
    waited = microbatch - (stages - stage)
    return waited if waited >= 0 else None


def activations_in_flight(order: Sequence[tuple[str, int]]) -> int:
    """The most microbatches between forward and backward at once in a stage's order."""
    alive, peak = 0, 0
    for phase, _ in order:
        alive += 1 if phase == "F" else -1
        peak = max(peak, alive)
    return peak


def scheduled_step_seconds(microbatches: int, stages: int, slowest_stage: float) -> float:
    """The step time a pipeline schedule allows: ``(M + K - 1)`` slots of the
    slowest stage's time per microbatch (forward and backward)."""
    return (microbatches + stages - 1) * slowest_stage


def stage_seconds_per_microbatch(
    ops: Iterable[tuple[str, str, int, int]], steps: int, microbatches: int
) -> dict[int, float]:
    """Each stage's busy time per microbatch (forward + backward op time), from
    profiled (node name, op type, start ns, end ns) of ``steps`` steps.

    Busy time is summed op time, not an interval's span, so microbatches that
    overlap on other stages do not stretch it; hybridpar's deferred weight
    gradients (``weight_gradients/`` of ``stage<k>``) count on their stage.
    """
    busy: dict[int, float] = {}
    for name, op_type, start, end in ops:
        where = classify_op(name, op_type)
        stage = where[1] if where is not None else _deferred_stage(name, op_type)
        if stage is not None:
            busy[stage] = busy.get(stage, 0.0) + (end - start) / 1e9
    return {stage: total / steps / microbatches for stage, total in sorted(busy.items())}


_DEFERRED_OP = re.compile(r"(?:^|/)weight_gradients_stage(\d+)(?:_\d+)?/")


def _deferred_stage(name: str, op_type: str) -> int | None:
    if "replica_" in name or op_type in BOOKKEEPING_OPS:
        return None
    match = _DEFERRED_OP.search(name)
    return None if match is None else int(match[1])


@dataclasses.dataclass(frozen=True)
class Interval:
    """One stage working on one microbatch in one phase of one step (seconds)."""

    step: int
    microbatch: int
    stage: int
    phase: str
    start: float
    end: float


def classify_op(name: str, op_type: str = "") -> tuple[int, int, str] | None:
    """(microbatch, stage, phase) of a replica-0 op from its node name, if staged
    (an op outside any ``microbatch<i>`` scope is microbatch 0 of an unsplit step).

    Ops of other replicas (``replica_<r>/`` scopes), ops outside a stage
    (input handling, the loss) and bookkeeping ops give ``None``.
    """
    if "replica_" in name or op_type in BOOKKEEPING_OPS:
        return None
    match = _STAGED_OP.search(name)
    if match is None:
        return None
    phase = "backward" if "gradient_tape/" in name else "forward"
    return int(match[1] or 0), int(match[2]), phase  # no microbatch scope: M = 1


def intervals_from_ops(
    ops: Iterable[tuple[str, str, int, int]], windows: Mapping[int, tuple[int, int]]
) -> list[Interval]:
    """Each (step, microbatch, stage, phase)'s first start and last end.

    Args:
        ops: (node name, op type, start ns, end ns) of the ops that ran.
        windows: step -> (start ns, end ns) of the steps to keep.
    """
    spans: dict[tuple[int, int, int, str], list[int]] = {}
    for name, op_type, start, end in ops:
        where = classify_op(name, op_type)
        step = next((s for s, (low, high) in windows.items() if low <= start <= high), None)
        if where is None or step is None:
            continue
        span = spans.setdefault((step, *where), [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return [
        Interval(step, microbatch, stage, phase, start / 1e9, end / 1e9)
        for (step, microbatch, stage, phase), (start, end) in sorted(spans.items())
    ]


def chrome_trace(intervals: Sequence[Interval], devices: Sequence[str]) -> dict:
    """The intervals as a Chrome trace-event document (times relative to the first).

    Args:
        intervals: the recorded intervals.
        devices: the device of each stage (row names).
    """
    origin = min((i.start for i in intervals), default=0.0)
    events: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": stage,
         "args": {"name": f"stage {stage} ({device})"}}
        for stage, device in enumerate(devices)
    ]
    for interval in intervals:
        events.append(
            {
                "ph": "X",
                "pid": 0,
                "tid": interval.stage,
                "name": f"{interval.phase[0].upper()}{interval.microbatch}",
                "cat": interval.phase,
                "ts": (interval.start - origin) * 1e6,
                "dur": max(interval.end - interval.start, 0.0) * 1e6,
                "args": {"step": interval.step, "microbatch": interval.microbatch},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(
    intervals: Sequence[Interval], devices: Sequence[str], path: str | os.PathLike
) -> None:
    """Writes ``chrome_trace`` as JSON to ``path``."""
    with open(path, "w") as handle:
        json.dump(chrome_trace(intervals, devices), handle)


def save_timeline_png(
    intervals: Sequence[Interval],
    devices: Sequence[str],
    path: str | os.PathLike,
    title: str = "",
) -> None:
    """Draws the intervals as a Gantt chart, stages as rows, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    origin = min((i.start for i in intervals), default=0.0)
    stages = len(devices)
    figure, axes = pyplot.subplots(figsize=(11, 1.0 + 0.7 * stages), dpi=100)
    colours = pyplot.get_cmap("tab10")
    for interval in intervals:
        start = (interval.start - origin) * 1e3
        width = max((interval.end - interval.start) * 1e3, 1e-3)
        forward = interval.phase == "forward"
        axes.broken_barh(
            [(start, width)], (interval.stage - 0.4, 0.8),
            facecolors=colours(interval.microbatch % 10), alpha=0.9 if forward else 0.5,
            edgecolor="black", linewidth=0.4, hatch=None if forward else "//",
        )
        axes.text(start + width / 2, interval.stage, f"{'F' if forward else 'B'}"
                  f"{interval.microbatch}", ha="center", va="center", fontsize=6)
    axes.set_yticks(range(stages), [f"stage {s}\n{d}" for s, d in enumerate(devices)], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("ms (F = forward, B = backward, one colour per microbatch)")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)

"""``PipelineTimeline``: the measured pipeline schedule of a few training steps."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import keras
import tensorflow as tf

from hybridpar.errors import ConfigError
from hybridpar.parallel.schedule import (
    Interval,
    intervals_from_ops,
    save_timeline_png,
    write_chrome_trace,
)
from hybridpar.state import StrategyState, state_of

STEP_EVENT = "hybridpar_step_"


class PipelineTimeline(keras.callbacks.Callback):
    """Records the pipeline schedule of a few training steps and draws it.

    TensorFlow's profiler records every op the steps run; ops are attributed
    to a microbatch, a stage and a phase by the name scopes hybridpar gives
    them (``microbatch<i>``, ``hybridpar_stage<k>``, ``gradient_tape``), so
    the schedule is measured, not inferred, and recording does not change it.
    At the end of training it writes ``timeline.png`` (stages as rows, one
    colour per microbatch) and ``timeline.trace.json`` (a Chrome trace for
    chrome://tracing or Perfetto) to ``directory``, for replica 0.

    Args:
        directory: where the files go.
        steps: how many steps to record, from the second step of training
            (the first one includes tracing).
    """

    def __init__(self, directory: str | os.PathLike, steps: int = 3) -> None:
        super().__init__()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"PipelineTimeline needs steps >= 1. Received: steps={steps!r}.")
        self.directory = Path(directory)
        self.steps = steps
        self.intervals: list[Interval] = []
        self._state: StrategyState | None = None
        self._step = 0
        self._trace_dir: str | None = None
        self._step_trace: tf.profiler.experimental.Trace | None = None
        self._recorded: list[int] = []

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._state = state_of(model.distribute_strategy)
        if self._state is None:
            raise ConfigError(
                "PipelineTimeline needs a model built and compiled inside hybridpar.scope(); "
                f"{model.name!r} was built under {type(model.distribute_strategy).__name__}."
            )

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._step == 1:
            self._trace_dir = tempfile.mkdtemp(prefix="hybridpar-timeline-")
            tf.profiler.experimental.start(self._trace_dir)
        if self._trace_dir is not None:
            self._step_trace = tf.profiler.experimental.Trace(f"{STEP_EVENT}{self._step}")
            self._step_trace.__enter__()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self._step == self.steps:
            self._collect()
        self._step += 1

    def _collect(self) -> None:
        if self._trace_dir is None:
            return
        tf.profiler.experimental.stop()
        ops = profiled_ops(self._trace_dir)
        windows = {
            int(name[len(STEP_EVENT):]): (start, end)
            for name, _, start, end in ops
            if name.startswith(STEP_EVENT)
        }
        self.intervals = intervals_from_ops(ops, windows)
        self._recorded = sorted(windows)
        shutil.rmtree(self._trace_dir, ignore_errors=True)
        self._trace_dir = None

    def on_train_end(self, logs: dict | None = None) -> None:
        self._collect()
        mesh = self._state.plan.mesh
        devices = mesh.replica_devices(0)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_chrome_trace(self.intervals, devices, self.directory / "timeline.trace.json")
        save_timeline_png(
            self.intervals, devices, self.directory / "timeline.png",
            title=f"replica 0: {mesh.stages} stage(s) x {self._state.microbatches} "
            f"microbatch(es), steps {', '.join(map(str, self._recorded))}",
        )


def profiled_ops(trace_dir: str) -> list[tuple[str, str, int, int]]:
    """(node name, op type, start ns, end ns) of every event in the profiler's trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    ops = []
    for path in Path(trace_dir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name, _, op_type = plane.event_metadata[event.metadata_id].name.partition(":")
                    start = line.timestamp_ns + event.offset_ps // 1000
                    ops.append((name, op_type, start, start + event.duration_ps // 1000))
    return ops

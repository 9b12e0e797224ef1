"""The state each strategy hybridpar builds carries, and how fixes recognise such strategies.

Every ``tf.distribute`` strategy hybridpar builds is an instance of one of its
own subclasses (``hybridpar.strategies``), all deriving from ``OwnedStrategy``
and carrying one ``StrategyState``. The Keras fixes (``hybridpar.compat``)
act only where ``state_of(strategy)`` is not ``None``; anything else runs
Keras's and TensorFlow's own code. Pure Python: no TensorFlow here.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hybridpar.config import StrategyConfig
    from hybridpar.topology.cluster import ClusterInfo
    from hybridpar.topology.mesh import DeviceMesh
    from hybridpar.topology.placement import PathEntry, PlacementRules
    from hybridpar.topology.plan import Plan


class Placer(Protocol):
    """What a strategy's stage placer answers (``hybridpar.parallel.staging.StagePlacer``).

    A protocol so that this module, below ``parallel`` in the layers, never
    imports it.
    """

    mesh: DeviceMesh
    rules: PlacementRules
    mirrored: bool
    microbatches: int

    def stage_of(self, path: Sequence[PathEntry]) -> int:
        """The stage of the layer at the end of ``path``."""

    def device_for(self, stage: int) -> str | None:
        """Stage ``stage``'s device in the replica running now."""


class Runner(Protocol):
    """What runs ``fit``/``evaluate``/``predict`` instead of Keras's loops.

    The parameter-server chief's (``strategies.ps_training``) and the
    evaluator's (``strategies.evaluator``). ``fit`` gets its arguments by name,
    bound by Keras's own signature (``hybridpar.training.fit_arguments``);
    ``evaluate`` and ``predict`` get the caller's.
    """

    def fit(self, model: Any, arguments: dict[str, Any]) -> Any:
        """``model.fit`` with ``arguments`` (every parameter of Keras's ``fit``)."""

    def evaluate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate(*args, **kwargs)``."""

    def predict(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.predict(*args, **kwargs)``."""


@dataclasses.dataclass(eq=False)
class StrategyState:
    """Everything hybridpar keeps about one of its strategies.

    Attributes:
        config: the config the strategy was built from.
        plan: mode, device mesh and worker count, checked against the runtime.
        cluster: the TF_CONFIG cluster, or ``None`` for a single process.
        placer: where each model-parallel stage's variables and ops go.
        trainer: what Keras's trainer methods run for the strategy's models
            (``hybridpar.training.Trainer``, reached through
            ``compat.trainer_hooks``); set when the strategy is built.
        runner: what runs ``fit``/``evaluate``/``predict`` of the strategy's
            models instead of Keras's loops: the parameter-server chief's, or
            the evaluator's; ``None`` elsewhere.
        preemption: the preemption watcher, once ``fit`` created one.
        compression: ``communication.compression`` at work
            (``hybridpar.parallel.compression.GradientCompression``), or
            ``None`` when gradients are all-reduced exactly.
        zero: ``data_parallel.shard_optimizer_state`` at work
            (``hybridpar.parallel.zero.ZeroSharding``), or ``None``.
    """

    config: StrategyConfig
    plan: Plan
    cluster: ClusterInfo | None
    placer: Placer
    trainer: Any = None
    runner: Runner | None = None
    preemption: Any = None
    compression: Any = None
    zero: Any = None

    @property
    def mode(self) -> str:
        """``none``, ``mirrored``, ``multi_worker`` or ``parameter_server``."""
        return self.plan.mode

    @property
    def stages(self) -> int:
        """Model-parallel stages per replica."""
        return self.plan.mesh.stages

    @property
    def microbatches(self) -> int:
        """Pipeline microbatches per replica batch."""
        return self.config.model_parallel.microbatches

    @property
    def global_batch_size(self) -> int | None:
        """``data.global_batch_size``: examples per step over all replicas, if set."""
        return self.config.data.global_batch_size

    @property
    def is_chief(self) -> bool:
        """True for the process that writes logs, checkpoints and saved models."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def is_evaluator(self) -> bool:
        """True on the cluster's ``evaluator`` task (sidecar evaluation, no training)."""
        return self.plan.evaluator

    def output_dir(self, path: str | os.PathLike) -> Path:
        """Where this process writes files meant for ``path``.

        The chief writes to ``path`` itself and the evaluator to
        ``path/evaluator``, its own files beside the chief's; every other
        worker gets a private temporary directory, removed when the process
        exits, so logs, saved models and checkpoints come from the chief only
        and workers never collide on a shared file system.
        """
        if self.is_chief:
            return Path(path)
        if self.is_evaluator:
            return Path(path) / "evaluator"
        task = f"{self.cluster.task_type}-{self.cluster.task_index}" if self.cluster else "task"
        private = Path(tempfile.mkdtemp(prefix=f"hybridpar-{task}-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        return private


class OwnedStrategy:
    """Base of every ``tf.distribute.Strategy`` subclass hybridpar builds.

    Subclasses set ``hybridpar_state`` before their ``tf.distribute``
    initialiser runs.
    """

    hybridpar_state: StrategyState


def state_of(strategy: Any) -> StrategyState | None:
    """The state of a strategy hybridpar built, or ``None`` for any other object."""
    return strategy.hybridpar_state if isinstance(strategy, OwnedStrategy) else None

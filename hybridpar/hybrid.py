"""The public entry points: ``scope()``, ``current()``, ``stage()`` and ``HybridStrategy``.

``scope(config)`` checks the config against this process's devices and
cluster (``topology.plan``), builds the strategy it asks for
(``strategies.build``) and enters it. ``HybridStrategy`` is what the scope
yields: the ``tf.distribute`` strategy and hybridpar's view of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from hybridpar import callbacks as callbacks_lib
from hybridpar import report
from hybridpar.compat import check_versions, holding
from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError
from hybridpar.parallel import auto_placement, tensor_split
from hybridpar.parallel import compression as compression_lib
from hybridpar.parallel import zero as zero_lib
from hybridpar.parallel.staging import StagePlacer
from hybridpar.state import StrategyState
from hybridpar.strategies.build import build_strategy
from hybridpar.topology import placement
from hybridpar.topology.cluster import ClusterInfo, cluster_from_env
from hybridpar.topology.placement import PlacementRules
from hybridpar.topology.plan import Plan, make_plan


class HybridStrategy:
    """The strategy hybridpar built for one config.

    Attributes:
        state: hybridpar's state of the strategy (config, plan, cluster, placer).
        strategy: the ``tf.distribute.Strategy`` in use (an instance of the
            ``tf.distribute`` class of its mode).
    """

    def __init__(self, state: StrategyState, strategy: tf.distribute.Strategy) -> None:
        self.state = state
        self.strategy = strategy

    @property
    def config(self) -> StrategyConfig:
        """The config the strategy was built from."""
        return self.state.config

    @property
    def plan(self) -> Plan:
        """Mode, device mesh and worker count, checked against the runtime."""
        return self.state.plan

    @property
    def cluster(self) -> ClusterInfo | None:
        """The TF_CONFIG cluster, or ``None`` for a single process."""
        return self.state.cluster

    @property
    def mode(self) -> str:
        """``none``, ``mirrored``, ``multi_worker`` or ``parameter_server``."""
        return self.state.mode

    @property
    def num_replicas(self) -> int:
        """Data-parallel replicas in sync."""
        return self.strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        """The local devices this process trains on."""
        return self.state.plan.mesh.devices

    @property
    def is_chief(self) -> bool:
        """True for the process that writes logs, checkpoints and saved models."""
        return self.state.is_chief

    @property
    def is_evaluator(self) -> bool:
        """True on the cluster's ``evaluator`` task: ``fit`` evaluates the chief's
        checkpoints instead of training (``hybridpar.strategies.evaluator``)."""
        return self.state.is_evaluator

    def output_dir(self, path: str | os.PathLike) -> Path:
        """Where this process writes files meant for ``path``: ``path`` on the chief,
        ``path/evaluator`` on the evaluator, a private temporary directory (removed
        at exit) on other workers."""
        return self.state.output_dir(path)

    def describe(self, model: Any) -> report.PlacementReport:
        """The placement report of a model built in this scope.

        Returns:
            ``print()`` it for the table of layer -> stage -> devices with
            bytes per device (weights and optimizer slots); ``.save_png(path)``
            draws the mesh.

        Raises:
            ConfigError: for a placement rule that matches no layer, a layer
                matched by two rules, or a stage index out of range; and for a
                tensor-parallel layout that does not fit the model.
        """
        auto_placement.ensure_placed(model, self.state.placer)
        tensor_split.ensure_split(model, self.state)
        return report.describe(model, self.state.placer)

    def callbacks(self) -> list[Any]:
        """The Keras callbacks the config asks for (checkpoints, backup/restore).

        Raises:
            ConfigError: if ``checkpoint.dir`` cannot be written.
        """
        return callbacks_lib.defaults(self.config, hybrid=self)

    @contextlib.contextmanager
    def scope(self) -> Iterator[HybridStrategy]:
        """Enters this strategy: variables created inside are distributed by it.

        Raises:
            ConfigError: inside the scope of a different strategy (TensorFlow
                cannot mix two strategies).
        """
        outer = current()
        if outer is not None and outer.strategy is not self.strategy:
            raise ConfigError(
                f"hybridpar.scope() cannot nest inside another strategy's scope: the outer "
                f"scope is {outer!r}, the inner one {self!r}. Leave the outer scope first, or "
                "re-enter the same strategy with `with hs.scope():`."
            )
        _active.stack.append(self)
        try:
            with self.strategy.scope():
                yield self
        finally:
            _active.stack.pop()

    def __repr__(self) -> str:
        return (
            f"HybridStrategy(mode={self.mode!r}, num_replicas={self.num_replicas}, "
            f"devices={list(self.devices)}, is_chief={self.is_chief}"
            f"{', is_evaluator=True' if self.is_evaluator else ''})"
        )


class _ActiveScopes(threading.local):
    def __init__(self) -> None:
        self.stack: list[HybridStrategy] = []


_active = _ActiveScopes()


def current() -> HybridStrategy | None:
    """The innermost active ``hybridpar.scope()``, or ``None`` outside any."""
    return _active.stack[-1] if _active.stack else None


def _local_device_names(cluster: ClusterInfo | None) -> list[str]:
    """This process's logical devices as ``/device:TYPE:i`` (initialises TF's devices).

    Once a process joined a cluster, TensorFlow also lists the other tasks'
    devices; only this task's own are returned.
    """
    names = []
    for device in tf.config.list_logical_devices():
        spec = tf.DeviceSpec.from_string(device.name)
        if cluster is not None and spec.job not in (None, "localhost") and (
            spec.job != cluster.task_type or (spec.task or 0) != cluster.task_index
        ):
            continue
        names.append(f"/device:{spec.device_type}:{spec.device_index}")
    return names


def build(config: StrategyConfig | None = None) -> HybridStrategy:
    """Checks ``config`` against this process's runtime and builds its strategy.

    Raises:
        ConfigError: when the config does not fit the devices or cluster, or
            asks for gradient compression or sharded optimizer state in
            parameter-server mode.
    """
    config = config if config is not None else StrategyConfig()
    if tf.distribute.has_strategy():
        raise ConfigError(
            "hybridpar cannot build a strategy inside another strategy's scope (outer: "
            f"{current() or tf.distribute.get_strategy()!r}); TensorFlow cannot mix two. "
            "Leave the outer scope first, or re-enter an existing one with `with hs.scope():`."
        )
    cluster = cluster_from_env()
    plan = make_plan(config, _local_device_names(cluster), cluster)
    compression = compression_lib.from_config(config, plan)
    zero = zero_lib.from_config(config, plan)
    parallel = config.model_parallel
    rules = PlacementRules(parallel.rules, plan.mesh.stages)
    placer = StagePlacer(plan.mesh, rules, plan.mode != "none", parallel.microbatches,
                         auto=parallel.auto, memory_limit=parallel.device_memory_bytes)
    state = StrategyState(config=config, plan=plan, cluster=cluster, placer=placer,
                          compression=compression, zero=zero)
    return HybridStrategy(state, build_strategy(state))


def _as_config(config: StrategyConfig | str | os.PathLike | dict | None) -> StrategyConfig:
    if config is None or isinstance(config, StrategyConfig):
        return config or StrategyConfig()
    if isinstance(config, (str, os.PathLike)):
        return StrategyConfig.from_yaml(Path(config))
    if isinstance(config, dict):
        return StrategyConfig.from_dict(config)
    raise ConfigError(
        "hybridpar.scope() takes a StrategyConfig, a YAML path, a dict or nothing. "
        f"Received: {type(config).__name__}."
    )


@contextlib.contextmanager
def scope(
    config: StrategyConfig | str | os.PathLike | dict | None = None,
) -> Iterator[HybridStrategy]:
    """Builds the strategy for ``config`` and enters it.

    Models built and compiled inside train under the strategy; call
    ``model.fit`` inside or after the block. Scopes nest; leaving one restores
    the previous one, also on error.

    Args:
        config: a StrategyConfig, the path of a YAML config, a dict, or
            ``None`` for the defaults (``mode: auto`` over all local devices).

    Yields:
        The active ``HybridStrategy``.
    """
    hybrid = build(_as_config(config))
    with hybrid.scope():
        yield hybrid


@contextlib.contextmanager
def stage(index: int) -> Iterator[int]:
    """Places every layer constructed inside the block on stage ``index``.

    Example::

        with hybridpar.scope(config):
            with hybridpar.stage(1):
                head = keras.layers.Dense(10, name="head")

    The stage is kept on the layer object; it is not saved with the model, so
    a model reloaded with ``keras.models.load_model`` is placed by
    ``model_parallel.placement`` rules only.

    Raises:
        ConfigError: if ``index`` is not an integer >= 0 (an index past the
            configured stages is reported when the layer is placed).
    """
    check_versions()
    with holding("stage_marks"), placement.stage(index):
        yield index

"""Builds the tf.distribute strategy a config asks for; ``scope()`` and ``current()``."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from hybridpar import keras_compat, staging
from hybridpar.cluster import ClusterInfo, cluster_from_env
from hybridpar.config import StrategyConfig
from hybridpar.devices import device_kind
from hybridpar.errors import ConfigError
from hybridpar.placement import PlacementRules
from hybridpar.plan import Plan, make_plan

logger = logging.getLogger("hybridpar")


class HybridStrategy:
    """The strategy hybridpar built for one config.

    Attributes:
        config: the config it was built from.
        plan: mode, device mesh and worker count, checked against the runtime.
        strategy: the ``tf.distribute.Strategy`` in use.
        cluster: the TF_CONFIG cluster, or ``None`` for a single process.
    """

    def __init__(
        self,
        config: StrategyConfig,
        plan: Plan,
        strategy: tf.distribute.Strategy,
        cluster: ClusterInfo | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.strategy = strategy
        self.cluster = cluster

    @property
    def mode(self) -> str:
        """``none``, ``mirrored``, ``multi_worker`` or ``parameter_server``."""
        return self.plan.mode

    @property
    def num_replicas(self) -> int:
        """Data-parallel replicas in sync."""
        return self.strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        """The local devices this process trains on."""
        return self.plan.mesh.devices

    @property
    def is_chief(self) -> bool:
        """True for the process that writes logs, checkpoints and saved models."""
        return self.cluster is None or self.cluster.is_chief

    def output_dir(self, path: str | os.PathLike) -> Path:
        """Where this process writes files meant for ``path``.

        The chief writes to ``path`` itself; every other worker gets a private
        temporary directory, removed when the process exits, so logs, saved
        models and checkpoints come from the chief only and workers never
        collide on a shared file system.
        """
        if self.is_chief:
            return Path(path)
        task = f"{self.cluster.task_type}-{self.cluster.task_index}" if self.cluster else "task"
        private = Path(tempfile.mkdtemp(prefix=f"hybridpar-{task}-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        return private

    def describe(self, model: Any) -> Any:
        """The placement report of a model built in this scope.

        Returns:
            A ``hybridpar.report.PlacementReport``: ``print()`` it for the table
            of layer -> stage -> devices with bytes per device (weights and
            optimizer slots); ``.save_png(path)`` draws the mesh.

        Raises:
            ConfigError: for a placement rule that matches no layer, a layer
                matched by two rules, or a stage index out of range.
        """
        from hybridpar import report

        return report.describe(model, staging.placer_for(self.strategy))

    def callbacks(self) -> list[Any]:
        """The Keras callbacks the config asks for (checkpoints, backup/restore).

        Raises:
            ConfigError: if ``checkpoint.dir`` cannot be written.
        """
        from hybridpar import callbacks

        return callbacks.defaults(self.config, hybrid=self)

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
            f"devices={list(self.devices)}, is_chief={self.is_chief})"
        )


class _ActiveScopes(threading.local):
    def __init__(self) -> None:
        self.stack: list[HybridStrategy] = []


_active = _ActiveScopes()


def current() -> HybridStrategy | None:
    """The innermost active ``hybridpar.scope()``, or ``None`` outside any."""
    return _active.stack[-1] if _active.stack else None


def local_device_names(cluster: ClusterInfo | None = None) -> list[str]:
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


def _unsupported(what: str, received: str) -> ConfigError:
    return ConfigError(
        f"{what} is not available in this version of hybridpar. Received: {received}. "
        "Remove it from the config (the key is reserved so configs stay stable)."
    )


def _build_none(
    plan: Plan, config: StrategyConfig, cluster: ClusterInfo | None
) -> tf.distribute.Strategy:
    return tf.distribute.OneDeviceStrategy(plan.mesh.devices[0])


def _build_mirrored(
    plan: Plan, config: StrategyConfig, cluster: ClusterInfo | None
) -> tf.distribute.Strategy:
    devices = plan.mesh.stage_devices(0)
    implementation = config.communication.implementation
    if implementation == "nccl" and any(device_kind(d) != "GPU" for d in devices):
        raise ConfigError(
            "communication.implementation='nccl' needs GPU devices only, but the replicas "
            f"run on {', '.join(devices)}. Use 'auto' or 'ring'."
        )
    return keras_compat.mirrored_strategy(devices, ring=implementation == "ring")


def _build_multi_worker(
    plan: Plan, config: StrategyConfig, cluster: ClusterInfo | None
) -> tf.distribute.Strategy:
    from hybridpar import multiworker

    return multiworker.build_strategy(config, cluster)


def _build_parameter_server(
    plan: Plan, config: StrategyConfig, cluster: ClusterInfo | None
) -> tf.distribute.Strategy:
    from hybridpar import parameter_server

    return parameter_server.build_strategy(config, cluster)


_Builder = Callable[[Plan, StrategyConfig, ClusterInfo | None], tf.distribute.Strategy]
_BUILDERS: dict[str, _Builder] = {
    "none": _build_none,
    "mirrored": _build_mirrored,
    "multi_worker": _build_multi_worker,
    "parameter_server": _build_parameter_server,
}


def build(config: StrategyConfig | None = None) -> HybridStrategy:
    """Checks ``config`` against this process's runtime and builds its strategy.

    Raises:
        ConfigError: when the config does not fit the devices or cluster, or
            asks for something this version cannot do.
    """
    config = config if config is not None else StrategyConfig()
    if tf.distribute.has_strategy():
        raise ConfigError(
            "hybridpar cannot build a strategy inside another strategy's scope (outer: "
            f"{current() or tf.distribute.get_strategy()!r}); TensorFlow cannot mix two. "
            "Leave the outer scope first, or re-enter an existing one with `with hs.scope():`."
        )
    keras_compat.install()
    cluster = cluster_from_env()
    plan = make_plan(config, local_device_names(cluster), cluster)
    if config.communication.compression != "none":
        compression = config.communication.compression
        raise _unsupported("Gradient compression", f"communication.compression={compression!r}")
    builder = _BUILDERS.get(plan.mode)
    if builder is None:
        raise _unsupported(f"Mode {plan.mode!r}", f"data_parallel.mode resolved to {plan.mode!r}")
    strategy = builder(plan, config, cluster)
    keras_compat.register_global_batch_size(strategy, config.data.global_batch_size)
    rules = PlacementRules(config.model_parallel.placement, plan.mesh.stages)
    keras_compat.place_variables_by_stage(
        strategy,
        staging.StagePlacer(
            plan.mesh, rules, plan.mode != "none", config.model_parallel.microbatches
        ),
    )
    logger.info(
        "hybridpar: mode=%s replicas=%d stages=%d microbatches=%d devices=%s",
        plan.mode,
        strategy.num_replicas_in_sync,
        plan.mesh.stages,
        config.model_parallel.microbatches,
        ",".join(plan.mesh.devices),
    )
    hybrid = HybridStrategy(config, plan, strategy, cluster)
    if not hybrid.is_chief:
        keras_compat.register_private_output(strategy, hybrid.output_dir)
    return hybrid


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

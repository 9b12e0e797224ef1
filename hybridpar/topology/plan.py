"""Checks a config against the runtime and decides the layout (pure Python).

``make_plan`` is the one place where a config meets the runtime: after the
config's own checks, ``hybridpar.scope()`` runs it once, before it builds any
strategy, on plain data gathered at the edge (the local devices, the TF_CONFIG
cluster). The devices must exist, replicas x stages must fit in them, the
global batch must divide over the replicas, the cluster must suit the mode
(parameter servers, no ps tasks under multi_worker) and so must the settings
(``nccl`` on GPUs only, no compression, stages or tensor-parallel groups with
parameter servers). The strategy builders trust the plan and check nothing again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hybridpar.config import StrategyConfig, check_batch_divides
from hybridpar.config.devices import canonical_device, device_kind
from hybridpar.errors import ConfigError, RuntimeMismatchError
from hybridpar.topology.cluster import ClusterInfo
from hybridpar.topology.mesh import DeviceMesh
from hybridpar.topology.ps_cluster import check_cluster


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``scope()`` will build.

    Attributes:
        mode: the resolved mode (never ``auto``).
        mesh: the local devices as replicas x stages x tensor-parallel shards.
        num_workers: training processes in the cluster (1 without TF_CONFIG).
        explicit_devices: True when the user listed the devices.
        evaluator: True on the cluster's ``evaluator`` task, which trains
            nothing: its strategy is local (``mode`` is ``none`` or
            ``mirrored``) and ``fit`` evaluates the chief's checkpoints.
        cluster_mode: on the evaluator, the mode the training tasks run in.
    """

    mode: str
    mesh: DeviceMesh
    num_workers: int = 1
    explicit_devices: bool = False
    evaluator: bool = False
    cluster_mode: str | None = None

    @property
    def num_replicas(self) -> int:
        """Replicas in sync across the whole cluster."""
        return self.mesh.replicas * self.num_workers


def resolve_mode(config: StrategyConfig, cluster: ClusterInfo | None, local_replicas: int) -> str:
    """Resolves ``mode: auto``: ps tasks -> parameter_server; several workers ->
    multi_worker; several local replicas -> mirrored; else none."""
    mode = config.data_parallel.mode
    if mode != "auto":
        return mode
    if cluster is not None and cluster.num_ps > 0:
        return "parameter_server"
    if cluster is not None and cluster.num_workers > 1:
        return "multi_worker"
    return "mirrored" if local_replicas > 1 else "none"


def select_devices(config: StrategyConfig, available: Sequence[str]) -> tuple[str, ...]:
    """Chooses the local devices from the config and those that exist.

    ``devices: null`` means every local GPU (or TPU), else every logical CPU.

    Raises:
        RuntimeMismatchError: listing the devices that exist when a configured
            device is missing.
    """
    available = tuple(canonical_device(d) for d in available)
    wanted = config.data_parallel.devices
    if wanted is not None:
        missing = [d for d in wanted if d not in available]
        if missing:
            raise RuntimeMismatchError(
                f"data_parallel.devices names {', '.join(missing)}, which this process "
                f"does not have. Devices that exist: {', '.join(available)}. Fix "
                "data_parallel.devices, or set it to null to use every local device "
                "(on a CPU-only machine, hybridpar.testing.use_logical_cpus(n) or "
                "`hybridpar train --logical_cpus n` makes n logical CPU devices)."
            )
        return tuple(wanted)
    for kind in ("GPU", "TPU"):
        accelerators = tuple(d for d in available if device_kind(d) == kind)
        if accelerators:
            return accelerators
    return tuple(d for d in available if device_kind(d) == "CPU")


def _multi_worker_devices(config: StrategyConfig, selected: tuple[str, ...]) -> tuple[str, ...]:
    """The local devices of a worker under MultiWorkerMirroredStrategy.

    With one stage and no tensor-parallel group, MultiWorkerMirroredStrategy
    trains on every local GPU, else on CPU:0. With S stages of T devices each
    worker runs one model-parallel replica on its first S x T local devices.
    """
    per_replica = _per_replica(config)
    gpus = tuple(d for d in selected if device_kind(d) == "GPU")
    if per_replica == 1:
        devices = gpus or ("/device:CPU:0",)
    elif gpus:
        raise RuntimeMismatchError(
            f"data_parallel.mode='multi_worker' with {_per_replica_text(config)} runs one "
            "model-parallel replica per worker, but MultiWorkerMirroredStrategy makes every "
            f"local GPU a replica ({', '.join(gpus)} here); hybridpar cannot yet restrict it "
            "to one. Use stages=1 and tensor=1 on multi-GPU workers, or mode 'mirrored' on "
            "one host."
        )
    else:
        devices = selected[:per_replica]
    if config.data_parallel.devices is not None and tuple(config.data_parallel.devices) != devices:
        raise RuntimeMismatchError(
            f"data_parallel.mode='multi_worker' trains on {', '.join(devices)} here (every "
            "local GPU, or CPU:0, or the first stages x tensor devices), but "
            f"data_parallel.devices lists {', '.join(config.data_parallel.devices)}. Set "
            "data_parallel.devices to null (or to exactly those devices)."
        )
    return devices


def _evaluator_plan(
    config: StrategyConfig, available: Sequence[str], cluster: ClusterInfo
) -> Plan:
    """The evaluator's layout: the local devices, as a single process would use them.

    Raises:
        ConfigError: without ``checkpoint.dir`` (there would be nothing to evaluate).
    """
    if config.checkpoint.dir is None:
        raise ConfigError(
            f"Task {cluster.task} is the cluster's evaluator: it evaluates the checkpoints "
            "the chief writes to checkpoint.dir, but checkpoint.dir is not set. Received: "
            "checkpoint.dir=None. Set checkpoint.dir to the directory the chief writes "
            "(shared storage, the same value on every task)."
        )
    cluster_mode = resolve_mode(config, cluster, 1)
    if cluster_mode == "parameter_server":
        check_cluster(cluster, config)
    mode = config.data_parallel.mode
    local = config.override({"data_parallel.mode": mode if mode in ("none", "mirrored")
                             else "auto"})
    plan = make_plan(local, available, None)
    return dataclasses.replace(plan, evaluator=True, cluster_mode=cluster_mode)


def _check_parameter_server(config: StrategyConfig, cluster: ClusterInfo | None) -> None:
    """The cluster, the model-parallel settings and compression of ``parameter_server`` mode.

    Raises:
        RuntimeMismatchError: for a cluster that cannot train this way.
        ConfigError: for model-parallel stages, microbatches, tensor-parallel
            groups or gradient compression.
    """
    check_cluster(cluster, config)
    parallel = config.model_parallel
    if parallel.stages > 1 or parallel.microbatches > 1 or parallel.tensor > 1:
        raise ConfigError(
            "data_parallel.mode='parameter_server' trains whole models on each worker; "
            "model-parallel stages, microbatches and tensor-parallel groups are not "
            f"available with it. Received: model_parallel.stages={parallel.stages}, "
            f"model_parallel.microbatches={parallel.microbatches}, "
            f"model_parallel.tensor={parallel.tensor}. Set all three to 1, or use "
            "mode 'mirrored' or 'multi_worker' (whose replicas can be tensor-parallel "
            "groups; parameter servers already split large tables by variable_partitioner)."
        )
    compression = config.communication.compression
    if compression != "none":
        raise ConfigError(
            f"communication.compression={compression!r} compresses the synchronous "
            "gradient all-reduce of modes 'mirrored' and 'multi_worker' (and hybrid stages); "
            "parameter-server training pushes each worker's gradients to the ps tasks "
            "without an all-reduce. Received: data_parallel.mode='parameter_server'"
            f"{' (resolved from TF_CONFIG)' if config.data_parallel.mode == 'auto' else ''}. "
            "Set communication.compression to 'none', or train in mode 'multi_worker'."
        )


def _check_multi_worker(cluster: ClusterInfo | None) -> None:
    """Raises ConfigError for a ``multi_worker`` cluster with ps tasks."""
    if cluster is not None and cluster.num_ps:
        raise ConfigError(
            f"data_parallel.mode='multi_worker' cannot use a cluster with 'ps' tasks "
            f"(TF_CONFIG lists {cluster.num_ps}). Use mode 'parameter_server' (or 'auto'), "
            "or remove the ps job."
        )


def _check_idle_devices(config: StrategyConfig, available: Sequence[str]) -> None:
    """Raises RuntimeMismatchError when stages x tensor leaves local devices idle.

    Only when the devices were not listed: a listed subset is the user's choice.
    """
    if config.data_parallel.devices is not None:
        return
    found = select_devices(config, available)
    per_replica = _per_replica(config)
    if len(found) % per_replica:
        raise RuntimeMismatchError(
            f"{_per_replica_text(config)} does not divide the {len(found)} local devices "
            f"({', '.join(found)}): under mode 'mirrored' {len(found) % per_replica} of them "
            f"would sit idle. Use stages x tensor that divides {len(found)}, or list the "
            "devices to use in data_parallel.devices."
        )


def _check_mirrored(config: StrategyConfig, mesh: DeviceMesh) -> None:
    """Raises ConfigError when ``nccl`` is asked for replicas that are not all GPUs."""
    devices = mesh.stage_devices(0)
    if config.communication.implementation == "nccl" and any(
        device_kind(d) != "GPU" for d in devices
    ):
        raise ConfigError(
            "communication.implementation='nccl' needs GPU devices only, but the replicas "
            f"run on {', '.join(devices)}. Use 'auto' or 'ring'."
        )


def _local_devices(
    config: StrategyConfig, available: Sequence[str]
) -> tuple[str, ...]:
    """The selected devices, trimmed to whole replicas unless the user listed them.

    Raises:
        RuntimeMismatchError: when there are fewer devices than stages x tensor.
    """
    devices = select_devices(config, available)
    per_replica = _per_replica(config)
    if len(devices) < per_replica:
        raise RuntimeMismatchError(
            f"{_per_replica_text(config)} needs at least {per_replica} devices, but only "
            f"{len(devices)} are available: {', '.join(devices)}. Lower "
            "model_parallel.stages or model_parallel.tensor, or add devices."
        )
    if config.data_parallel.devices is not None:
        return devices
    return devices[: len(devices) - len(devices) % per_replica]


def _per_replica(config: StrategyConfig) -> int:
    """Devices one model replica runs on: stages x tensor-parallel shards."""
    return config.model_parallel.stages * config.model_parallel.tensor


def _per_replica_text(config: StrategyConfig) -> str:
    parallel = config.model_parallel
    if parallel.tensor == 1:
        return f"model_parallel.stages={parallel.stages}"
    return (f"model_parallel.stages={parallel.stages} x model_parallel.tensor="
            f"{parallel.tensor} = {_per_replica(config)} devices per replica")


def _mode_devices(
    config: StrategyConfig, mode: str, devices: tuple[str, ...], cluster: ClusterInfo | None
) -> tuple[str, ...]:
    """The devices ``mode`` trains on, after that mode's checks against the runtime."""
    per_replica = _per_replica(config)
    if mode == "none":
        if config.data_parallel.devices is not None and len(devices) > per_replica:
            raise RuntimeMismatchError(
                f"data_parallel.mode='none' trains one replica on {per_replica} device(s), "
                f"but data_parallel.devices lists {len(devices)}. Use mode 'mirrored'."
            )
        return devices[:per_replica]
    if mode == "multi_worker":
        _check_multi_worker(cluster)
        return _multi_worker_devices(config, devices)
    if mode == "parameter_server":
        _check_parameter_server(config, cluster)
    return devices


def _check_batch(config: StrategyConfig, plan: Plan) -> None:
    """Raises RuntimeMismatchError unless the global batch divides over the plan's replicas."""
    batch = config.data.global_batch_size
    if batch is None:
        return
    try:
        check_batch_divides(batch, plan.num_replicas, config.model_parallel.microbatches)
    except ConfigError as err:
        raise RuntimeMismatchError(
            f"{err} (replicas here: {plan.mesh.replicas} per worker on "
            f"{', '.join(plan.mesh.devices)} x {plan.num_workers} worker(s))."
        ) from None


def make_plan(
    config: StrategyConfig, available: Sequence[str], cluster: ClusterInfo | None = None
) -> Plan:
    """Checks ``config`` against the runtime and returns the layout to build.

    The runtime is plain data the caller gathered: the local devices that
    exist and the cluster from TF_CONFIG (its worker count among it). On an
    ``evaluator`` task the layout is local (see ``Plan.evaluator``).

    Args:
        config: a validated config.
        available: names of the local (logical) devices that exist.
        cluster: the cluster from TF_CONFIG, if any.

    Raises:
        RuntimeMismatchError: when devices are missing or too few, the batch
            does not divide over the replicas, or the cluster does not fit the mode.
        ConfigError: for settings the resolved mode cannot use, or on an
            evaluator task without ``checkpoint.dir``.
    """
    if cluster is not None and cluster.is_evaluator:
        return _evaluator_plan(config, available, cluster)
    devices = _local_devices(config, available)
    mode = resolve_mode(config, cluster, len(devices) // _per_replica(config))
    if mode == "mirrored":
        _check_idle_devices(config, available)
    mesh = DeviceMesh(_mode_devices(config, mode, devices, cluster),
                      config.model_parallel.stages, config.model_parallel.tensor)
    if mode == "mirrored":
        _check_mirrored(config, mesh)
    num_workers = cluster.num_workers if cluster is not None and mode == "multi_worker" else 1
    plan = Plan(mode=mode, mesh=mesh, num_workers=num_workers,
                explicit_devices=config.data_parallel.devices is not None)
    _check_batch(config, plan)
    return plan

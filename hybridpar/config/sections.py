"""The sections of the strategy configuration (pure Python, no TensorFlow).

Each section is a typed, frozen dataclass whose ``validate`` range-checks its
own fields; ``config.strategy.StrategyConfig`` nests them and checks the
rules that span sections.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from hybridpar.config.devices import canonical_device
from hybridpar.config.engine import Section, positive, require

Mode = Literal["auto", "none", "mirrored", "multi_worker", "parameter_server"]
ShardPolicy = Literal["auto", "file", "data", "off"]
Implementation = Literal["auto", "ring", "nccl"]
Compression = Literal["none", "fp16", "bf16", "powersgd"]
PartitionerKind = Literal["fixed", "min_size"]


@dataclasses.dataclass(frozen=True)
class DataParallelConfig(Section):
    """How replicas are formed.

    Attributes:
        mode: ``auto`` picks from TF_CONFIG and the local devices.
        devices: local devices to use; ``None`` means every local accelerator,
            or every (logical) CPU when there is none.
        shard_optimizer_state: ZeRO stage 1, optimizer slots sharded over replicas.
    """

    PATH: ClassVar[str] = "data_parallel"
    mode: Mode = "auto"
    devices: tuple[str, ...] | None = None
    shard_optimizer_state: bool = False

    def validate(self) -> None:
        require(not (self.shard_optimizer_state and self.mode == "parameter_server"),
                "data_parallel.shard_optimizer_state=true needs mode 'mirrored' or "
                "'multi_worker': the ps tasks of mode 'parameter_server' already hold each "
                "variable's optimizer state once. Received: data_parallel.mode="
                "'parameter_server'. Set shard_optimizer_state to false, or change mode.")
        if self.devices is None:
            return
        require(
            len(self.devices) > 0,
            "data_parallel.devices must list at least one device, or be null for all "
            "local devices. Received: data_parallel.devices=[].",
        )
        canonical = [canonical_device(d) for d in self.devices]
        duplicates = sorted({d for d in canonical if canonical.count(d) > 1})
        require(
            not duplicates,
            f"data_parallel.devices lists a device twice: {', '.join(duplicates)}. "
            f"Received: data_parallel.devices={list(self.devices)}.",
        )
        object.__setattr__(self, "devices", tuple(canonical))


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """Input batching and sharding.

    Attributes:
        global_batch_size: examples per step summed over all replicas.
        shard_policy: how input is split across workers.
    """

    PATH: ClassVar[str] = "data"
    global_batch_size: int | None = None
    shard_policy: ShardPolicy = "auto"

    def validate(self) -> None:
        positive("data.global_batch_size", self.global_batch_size)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    """Periodic checkpoints and backup/restore.

    Attributes:
        dir: where checkpoints go; ``None`` disables checkpointing.
        every_steps: save every N optimizer steps (``None``: not by steps).
        every_epochs: save every N epochs (``None``: not by epochs).
        keep: how many checkpoints to keep.
        backup_and_restore: resume an interrupted run from ``dir``.
        save_iterator: read ``fit``'s training input through one ``tf.data``
            iterator per worker and save its state with every checkpoint, so a
            resume continues at the step without drawing the batches already
            trained again; ``false`` keeps TensorFlow's distributed iterator
            (prefetching to the devices), whose position a resume replays.
    """

    PATH: ClassVar[str] = "checkpoint"
    dir: str | None = None
    every_steps: int | None = None
    every_epochs: int | None = 1
    keep: int = 3
    backup_and_restore: bool = True
    save_iterator: bool = True

    def validate(self) -> None:
        positive("checkpoint.every_steps", self.every_steps)
        positive("checkpoint.every_epochs", self.every_epochs)
        positive("checkpoint.keep", self.keep)
        require(
            self.dir is None or self.every_steps is not None or self.every_epochs is not None,
            f"checkpoint.dir={self.dir!r} is set but checkpoint.every_steps and "
            "checkpoint.every_epochs are both null, so nothing would be saved. Set one.",
        )


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig(Section):
    """Sidecar evaluation on the cluster's ``evaluator`` task (read there only).

    Attributes:
        log_dir: where the evaluator writes its TensorBoard summaries
            (``None``: ``<checkpoint.dir>/evaluator``).
        poll_seconds: how often the evaluator lists ``checkpoint.dir``.
        timeout_seconds: how long it waits for a new checkpoint before it
            gives up with an error (``None``: until the chief's final one).
    """

    PATH: ClassVar[str] = "evaluator"
    log_dir: str | None = None
    poll_seconds: float = 1.0
    timeout_seconds: float | None = None

    def validate(self) -> None:
        require(
            self.poll_seconds > 0,
            f"evaluator.poll_seconds must be > 0. Received: evaluator.poll_seconds="
            f"{self.poll_seconds!r}.",
        )
        require(
            self.timeout_seconds is None or self.timeout_seconds > 0,
            "evaluator.timeout_seconds must be > 0 or null. "
            f"Received: evaluator.timeout_seconds={self.timeout_seconds!r}.",
        )


@dataclasses.dataclass(frozen=True)
class PartitionerConfig(Section):
    """How large variables are split across parameter servers.

    Attributes:
        kind: ``fixed`` (exactly ``shards`` shards) or ``min_size`` (shards of
            at least ``min_shard_bytes``, at most ``max_shards``).
        shards: kind ``fixed``: how many shards each large variable is split into.
        min_shard_bytes: kind ``min_size``: the smallest shard, in bytes.
        max_shards: kind ``min_size``: the most shards one variable is split into.
    """

    PATH: ClassVar[str] = "parameter_server.partitioner"
    kind: PartitionerKind = "fixed"
    shards: int | None = None
    min_shard_bytes: int | None = None
    max_shards: int | None = None

    def validate(self) -> None:
        path = self.PATH
        if self.kind == "fixed":
            require(
                self.shards is not None and self.shards >= 1,
                f"{path} kind 'fixed' needs shards >= 1. Received: shards={self.shards!r}.",
            )
            require(
                self.min_shard_bytes is None and self.max_shards is None,
                f"{path} kind 'fixed' takes only 'shards'; min_shard_bytes and max_shards "
                "belong to kind 'min_size'.",
            )
        else:
            positive(f"{path}.min_shard_bytes", self.min_shard_bytes)
            require(
                self.max_shards is not None and self.max_shards >= 1,
                f"{path} kind 'min_size' needs max_shards >= 1. "
                f"Received: max_shards={self.max_shards!r}.",
            )
            require(
                self.shards is None,
                f"{path} kind 'min_size' does not take 'shards'; use max_shards.",
            )


@dataclasses.dataclass(frozen=True)
class ParameterServerConfig(Section):
    """Parameter-server options.

    Attributes:
        partitioner: how variables are sharded over the ps tasks (``None``:
            each variable whole on one ps).
    """

    PATH: ClassVar[str] = "parameter_server"
    partitioner: PartitionerConfig | None = None


@dataclasses.dataclass(frozen=True)
class PowerSGDConfig(Section):
    """PowerSGD gradient compression (``communication.compression: powersgd``).

    Attributes:
        rank: columns of the low-rank factors P (n x rank) and Q (m x rank)
            sent instead of an n x m gradient; higher is closer to the exact
            gradient and sends more.
        warmup_steps: optimizer steps trained with uncompressed gradients
            before PowerSGD starts.
        min_elements: gradients with fewer elements go uncompressed (they
            ride in the batched all-reduce of the P factors).
    """

    PATH: ClassVar[str] = "communication.powersgd"
    rank: int = 4
    warmup_steps: int = 0
    min_elements: int = 4096

    def validate(self) -> None:
        positive("communication.powersgd.rank", self.rank)
        for name in ("warmup_steps", "min_elements"):
            value = getattr(self, name)
            require(
                value >= 0,
                f"communication.powersgd.{name} must be >= 0. "
                f"Received: communication.powersgd.{name}={value!r}.",
            )


@dataclasses.dataclass(frozen=True)
class CommunicationConfig(Section):
    """Collective communication between replicas.

    Attributes:
        implementation: all-reduce implementation.
        compression: gradient compression on the wire: ``fp16``/``bf16``
            all-reduce floating gradients in that dtype, ``powersgd`` sends
            low-rank factors with error feedback.
        powersgd: PowerSGD's settings (only with ``compression: powersgd``;
            ``None``: the defaults).
        timeout_seconds: collective timeout, so a dead peer raises an error
            instead of hanging (``None``: TensorFlow's default, no timeout).
    """

    PATH: ClassVar[str] = "communication"
    implementation: Implementation = "auto"
    compression: Compression = "none"
    powersgd: PowerSGDConfig | None = None
    timeout_seconds: float | None = None

    def validate(self) -> None:
        require(
            self.timeout_seconds is None or self.timeout_seconds > 0,
            "communication.timeout_seconds must be > 0 or null. "
            f"Received: communication.timeout_seconds={self.timeout_seconds!r}.",
        )
        require(
            self.powersgd is None or self.compression == "powersgd",
            "communication.powersgd is set but communication.compression="
            f"{self.compression!r}; its keys apply only to compression 'powersgd'. "
            "Set communication.compression to 'powersgd', or remove communication.powersgd.",
        )

    @property
    def powersgd_settings(self) -> PowerSGDConfig:
        """``powersgd``, or the defaults when it is not given."""
        return self.powersgd if self.powersgd is not None else PowerSGDConfig()


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """What ``hybridpar train`` trains; unused by ``hybridpar.scope()``.

    Attributes:
        model: name of a model in ``hybridpar_models``.
        dataset: a tensorflow-datasets name (``hybridpar_digits`` is embedded).
        data_dir: tfds data directory (``None``: tfds's default).
        train_split: tfds split to train on.
        eval_split: tfds split to evaluate on after training (``None``: skip).
        epochs: training epochs.
        steps_per_epoch: steps per epoch (``None``: one pass over the data).
        optimizer: a Keras optimizer name.
        learning_rate: the optimizer's learning rate.
        shuffle: shuffle the training examples every epoch.
        seed: seed for weights, shuffling and dropout.
        timeline_steps: record the pipeline schedule of this many steps and
            write ``timeline.png`` and ``timeline.trace.json`` (0: don't).
    """

    PATH: ClassVar[str] = "train"
    model: str = "digits_mlp"
    dataset: str = "hybridpar_digits"
    data_dir: str | None = None
    train_split: str = "train"
    eval_split: str | None = "test"
    epochs: int = 3
    steps_per_epoch: int | None = None
    optimizer: str = "adam"
    learning_rate: float = 0.001
    shuffle: bool = True
    seed: int = 0
    timeline_steps: int = 0

    def validate(self) -> None:
        positive("train.epochs", self.epochs)
        require(
            self.timeline_steps >= 0,
            f"train.timeline_steps must be >= 0. Received: {self.timeline_steps}.",
        )
        positive("train.steps_per_epoch", self.steps_per_epoch)
        require(
            self.learning_rate > 0,
            f"train.learning_rate must be > 0. Received: train.learning_rate={self.learning_rate}.",
        )

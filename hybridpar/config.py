"""The declarative strategy configuration (pure Python, no TensorFlow).

One ``StrategyConfig`` holds nested, typed, frozen sections. Every way of
making one (``from_yaml``, ``from_dict``, ``override`` or the constructors)
goes through the same checks: unknown keys are refused with a did-you-mean,
values are type-checked and range-checked per field, and cross-field rules
run on the whole config. Checks against the devices and cluster that exist
are separate (``hybridpar.plan``) and run inside ``hybridpar.scope()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from hybridpar.devices import canonical_device
from hybridpar.errors import ConfigError

Mode = Literal["auto", "none", "mirrored", "multi_worker", "parameter_server"]
ShardPolicy = Literal["auto", "file", "data", "off"]
Implementation = Literal["auto", "ring", "nccl"]
Compression = Literal["none", "fp16", "bf16"]
PartitionerKind = Literal["fixed", "min_size"]


def did_you_mean(received: str, candidates: typing.Iterable[str]) -> str:
    """Returns ``' Did you mean "x"?'`` for the closest candidate, or ``''``."""
    close = difflib.get_close_matches(received, list(candidates), n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return "a list of " + {str: "strings", int: "integers"}.get(item, _type_name(item))
    if origin is dict:
        key, value = typing.get_args(hint)
        return f"a mapping of {_type_name(key)} to {_type_name(value)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _is_a(value: Any, scalar: type) -> bool:
    if isinstance(value, bool):
        return scalar is bool
    if scalar is float:
        return isinstance(value, (int, float))
    return isinstance(value, scalar)


def _type_error(path: str, value: Any, hint: Any) -> ConfigError:
    return ConfigError(
        f"{path} must be {_type_name(hint)}. "
        f"Received: {path}={value!r} ({type(value).__name__})."
    )


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Checks ``value`` against the type ``hint`` and normalises it.

    Lists become tuples, mappings become sections or plain dicts, integers
    are accepted where a float is expected. Nothing else is converted:
    ``"3"`` is not an integer.
    """
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            return _build_section(hint, value, path)
        raise _type_error(path, value, hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        containers = {tuple: (list, tuple), dict: Mapping}
        expected = containers.get(typing.get_origin(inner))
        if (
            value is None
            or (inner in (int, float, str, bool) and not _is_a(value, inner))
            or (expected is not None and not isinstance(value, expected))
        ):
            raise _type_error(path, value, hint)
        return _coerce(value, inner, path)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            hint_text = did_you_mean(value, allowed) if isinstance(value, str) else ""
            raise ConfigError(
                f"{path} must be one of {', '.join(map(repr, allowed))}. "
                f"Received: {path}={value!r}.{hint_text}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _type_error(path, value, hint)
        (item_hint, _) = typing.get_args(hint)
        return tuple(_coerce(v, item_hint, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _type_error(path, value, hint)
        key_hint, value_hint = typing.get_args(hint)
        return {
            _coerce(k, key_hint, f"{path} key"): _coerce(v, value_hint, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    if hint in (bool, int, float, str):
        if not _is_a(value, hint):
            raise _type_error(path, value, hint)
        return float(value) if hint is float else value
    raise TypeError(f"Unsupported config type {hint!r} at {path}.")


def _build_section(cls: type, data: Mapping[str, Any], path: str) -> Any:
    """Builds section ``cls`` from a mapping, refusing unknown keys."""
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            full = f"{path}.{key}" if path else str(key)
            prefix = f"{path}." if path else ""
            suggestion = did_you_mean(full, [prefix + name for name in names])
            raise ConfigError(
                f'Unknown config key "{full}".{suggestion} '
                f"Valid keys{' in ' + repr(path) if path else ''}: {', '.join(names)}.",
            )
    return cls(**dict(data))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _positive(path: str, value: int | float | None) -> None:
    _require(
        value is None or value >= 1,
        f"{path} must be >= 1 (or null where allowed). Received: {path}={value!r}.",
    )


class _Section:
    """Base of every config section: type checks in ``__post_init__``."""

    PATH: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            path = f"{self.PATH}.{field.name}" if self.PATH else field.name
            value = _coerce(getattr(self, field.name), hints[field.name], path)
            object.__setattr__(self, field.name, value)
        self.validate()

    def validate(self) -> None:
        """Range checks of this section alone (cross-field rules live higher)."""

    def to_dict(self) -> dict[str, Any]:
        """Returns plain YAML-able data (lists, dicts, scalars)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, _Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class DataParallelConfig(_Section):
    """How replicas are formed.

    Attributes:
        mode: ``auto`` picks from TF_CONFIG and the local devices.
        devices: local devices to use; ``None`` means every local accelerator,
            or every (logical) CPU when there is none.
    """

    PATH: ClassVar[str] = "data_parallel"
    mode: Mode = "auto"
    devices: tuple[str, ...] | None = None

    def validate(self) -> None:
        if self.devices is None:
            return
        _require(
            len(self.devices) > 0,
            "data_parallel.devices must list at least one device, or be null for all "
            "local devices. Received: data_parallel.devices=[].",
        )
        canonical = [canonical_device(d) for d in self.devices]
        duplicates = sorted({d for d in canonical if canonical.count(d) > 1})
        _require(
            not duplicates,
            f"data_parallel.devices lists a device twice: {', '.join(duplicates)}. "
            f"Received: data_parallel.devices={list(self.devices)}.",
        )
        object.__setattr__(self, "devices", tuple(canonical))


@dataclasses.dataclass(frozen=True)
class ModelParallelConfig(_Section):
    """Model-parallel stages inside each replica.

    Attributes:
        stages: devices per replica; replicas = devices / stages.
        placement: regex (searched in the layer name) -> stage index.
        microbatches: pipeline microbatches per replica batch.
    """

    PATH: ClassVar[str] = "model_parallel"
    stages: int = 1
    placement: dict[str, int] = dataclasses.field(default_factory=dict)
    microbatches: int = 1

    def validate(self) -> None:
        _positive("model_parallel.stages", self.stages)
        _positive("model_parallel.microbatches", self.microbatches)
        for pattern, stage in self.placement.items():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ConfigError(
                    f"model_parallel.placement key is not a valid regular expression "
                    f"({err}). Received: {pattern!r}."
                ) from None
            _require(
                0 <= stage < self.stages,
                f"model_parallel.placement[{pattern!r}] names stage {stage}, but "
                f"model_parallel.stages={self.stages} allows stages 0..{self.stages - 1}. "
                "Raise model_parallel.stages or fix the index.",
            )


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """Input batching and sharding.

    Attributes:
        global_batch_size: examples per step summed over all replicas.
        shard_policy: how input is split across workers.
    """

    PATH: ClassVar[str] = "data"
    global_batch_size: int | None = None
    shard_policy: ShardPolicy = "auto"

    def validate(self) -> None:
        _positive("data.global_batch_size", self.global_batch_size)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(_Section):
    """Periodic checkpoints and backup/restore.

    Attributes:
        dir: where checkpoints go; ``None`` disables checkpointing.
        every_steps: save every N optimizer steps (``None``: not by steps).
        every_epochs: save every N epochs (``None``: not by epochs).
        keep: how many checkpoints to keep.
        backup_and_restore: resume an interrupted run from ``dir``.
    """

    PATH: ClassVar[str] = "checkpoint"
    dir: str | None = None
    every_steps: int | None = None
    every_epochs: int | None = 1
    keep: int = 3
    backup_and_restore: bool = True

    def validate(self) -> None:
        _positive("checkpoint.every_steps", self.every_steps)
        _positive("checkpoint.every_epochs", self.every_epochs)
        _positive("checkpoint.keep", self.keep)
        _require(
            self.dir is None or self.every_steps is not None or self.every_epochs is not None,
            f"checkpoint.dir={self.dir!r} is set but checkpoint.every_steps and "
            "checkpoint.every_epochs are both null, so nothing would be saved. Set one.",
        )


@dataclasses.dataclass(frozen=True)
class PartitionerConfig(_Section):
    """How large variables are split across parameter servers.

    Attributes:
        kind: ``fixed`` (exactly ``shards`` shards) or ``min_size`` (shards of
            at least ``min_shard_bytes``, at most ``max_shards``).
    """

    PATH: ClassVar[str] = "parameter_server.partitioner"
    kind: PartitionerKind = "fixed"
    shards: int | None = None
    min_shard_bytes: int | None = None
    max_shards: int | None = None

    def validate(self) -> None:
        path = self.PATH
        if self.kind == "fixed":
            _require(
                self.shards is not None and self.shards >= 1,
                f"{path} kind 'fixed' needs shards >= 1. Received: shards={self.shards!r}.",
            )
            _require(
                self.min_shard_bytes is None and self.max_shards is None,
                f"{path} kind 'fixed' takes only 'shards'; min_shard_bytes and max_shards "
                "belong to kind 'min_size'.",
            )
        else:
            _positive(f"{path}.min_shard_bytes", self.min_shard_bytes)
            _require(
                self.max_shards is not None and self.max_shards >= 1,
                f"{path} kind 'min_size' needs max_shards >= 1. "
                f"Received: max_shards={self.max_shards!r}.",
            )
            _require(
                self.shards is None,
                f"{path} kind 'min_size' does not take 'shards'; use max_shards.",
            )


@dataclasses.dataclass(frozen=True)
class ParameterServerConfig(_Section):
    """Parameter-server options."""

    PATH: ClassVar[str] = "parameter_server"
    partitioner: PartitionerConfig | None = None


@dataclasses.dataclass(frozen=True)
class CommunicationConfig(_Section):
    """Collective communication between replicas.

    Attributes:
        implementation: all-reduce implementation.
        compression: gradient compression on the wire.
        timeout_seconds: collective timeout, so a dead peer raises an error
            instead of hanging (``None``: TensorFlow's default, no timeout).
    """

    PATH: ClassVar[str] = "communication"
    implementation: Implementation = "auto"
    compression: Compression = "none"
    timeout_seconds: float | None = None

    def validate(self) -> None:
        _require(
            self.timeout_seconds is None or self.timeout_seconds > 0,
            "communication.timeout_seconds must be > 0 or null. "
            f"Received: communication.timeout_seconds={self.timeout_seconds!r}.",
        )


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
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
        _positive("train.epochs", self.epochs)
        _require(
            self.timeline_steps >= 0,
            f"train.timeline_steps must be >= 0. Received: {self.timeline_steps}.",
        )
        _positive("train.steps_per_epoch", self.steps_per_epoch)
        _require(
            self.learning_rate > 0,
            f"train.learning_rate must be > 0. Received: train.learning_rate={self.learning_rate}.",
        )


@dataclasses.dataclass(frozen=True)
class StrategyConfig(_Section):
    """The whole hybridpar configuration.

    Build it with ``from_yaml``, ``from_dict`` or the constructor; derive
    variants with ``override``. Instances are immutable.
    """

    PATH: ClassVar[str] = ""
    data_parallel: DataParallelConfig = dataclasses.field(default_factory=DataParallelConfig)
    model_parallel: ModelParallelConfig = dataclasses.field(default_factory=ModelParallelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    parameter_server: ParameterServerConfig = dataclasses.field(
        default_factory=ParameterServerConfig
    )
    communication: CommunicationConfig = dataclasses.field(default_factory=CommunicationConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def validate(self) -> None:
        """Cross-field rules that need no knowledge of the runtime."""
        mode = self.data_parallel.mode
        stages = self.model_parallel.stages
        microbatches = self.model_parallel.microbatches
        batch = self.data.global_batch_size
        if batch is not None:
            _require(
                batch % microbatches == 0,
                f"data.global_batch_size={batch} is not divisible by "
                f"model_parallel.microbatches={microbatches}. Each replica batch is split "
                "into microbatches, so choose a batch that is a multiple of it.",
            )
        devices = self.data_parallel.devices
        if devices is not None:
            _require(
                len(devices) % stages == 0,
                f"data_parallel.devices lists {len(devices)} devices, which do not divide "
                f"into model_parallel.stages={stages} stages per replica. List a multiple "
                f"of {stages} devices.",
            )
            replicas = len(devices) // stages
            _require(
                not (mode == "none" and replicas > 1),
                f"data_parallel.mode='none' trains one replica, but data_parallel.devices "
                f"lists {len(devices)} devices for model_parallel.stages={stages}. Use "
                "mode 'mirrored' for data parallelism, or list one device per stage.",
            )
            if batch is not None:
                check_batch_divides(batch, replicas, microbatches)
        partitioner = self.parameter_server.partitioner
        _require(
            partitioner is None or mode in ("auto", "parameter_server"),
            f"parameter_server.partitioner is set but data_parallel.mode={mode!r}; "
            "partitioners only apply in mode 'parameter_server'. Remove it or change mode.",
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StrategyConfig:
        """Builds a config from nested plain data (as parsed from YAML).

        Raises:
            ConfigError: on unknown keys, wrong types or invalid values.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(
                "A hybridpar config must be a mapping of sections "
                f"({', '.join(f.name for f in dataclasses.fields(cls))}). "
                f"Received: {type(data).__name__} {data!r}."
            )
        return _build_section(cls, data, "")

    @classmethod
    def from_yaml(cls, path: str | Path) -> StrategyConfig:
        """Reads a YAML config file.

        Raises:
            ConfigError: naming the file (and line, where known) when the file
                is missing, does not parse, or holds an invalid config.
        """
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(
                f"Cannot read config file {str(path)!r}: {err.strerror or err}. "
                "Pass the path of a YAML file such as configs/quickstart.yaml."
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            problem = getattr(err, "problem", None) or str(err)
            raise ConfigError(f"{where}: YAML does not parse: {problem}.") from None
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            line = _line_of_error(text, str(err))
            where = f"{path}:{line}" if line else str(path)
            raise ConfigError(f"{where}: {err}") from None

    def to_yaml(self) -> str:
        """Returns YAML text that ``from_yaml`` reads back to an equal config."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def override(self, overrides: Mapping[str, Any]) -> StrategyConfig:
        """Returns a copy with dotted keys replaced, e.g. ``{"data.global_batch_size": 256}``.

        A section key given a mapping (``{"data": {...}}``) updates only the
        keys in that mapping.

        Raises:
            ConfigError: for an unknown key (with a did-you-mean) or an invalid value.
        """
        tree = self.to_dict()
        for dotted, value in overrides.items():
            _set_dotted(tree, type(self), dotted, value)
        return type(self).from_dict(tree)

    @staticmethod
    def keys() -> list[str]:
        """Every dotted key a config accepts."""
        return _dotted_keys(StrategyConfig, "")


def check_batch_divides(global_batch: int, replicas: int, microbatches: int) -> None:
    """Raises ConfigError unless the global batch splits into replicas and microbatches."""
    _require(
        global_batch % replicas == 0,
        f"data.global_batch_size={global_batch} does not divide evenly across "
        f"{replicas} replicas. Use a multiple of {replicas}, e.g. "
        f"{max(replicas, global_batch // replicas * replicas)}.",
    )
    per_replica = global_batch // replicas
    _require(
        per_replica % microbatches == 0,
        f"The per-replica batch {per_replica} (data.global_batch_size={global_batch} / "
        f"{replicas} replicas) is not divisible by model_parallel.microbatches="
        f"{microbatches}. Use a global batch that is a multiple of "
        f"{replicas * microbatches}.",
    )


def _section_fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _section_type(hint: Any) -> type | None:
    """The section class behind a hint such as ``PartitionerConfig | None``."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _dotted_keys(cls: type, prefix: str) -> list[str]:
    keys = []
    for name, hint in _section_fields(cls).items():
        dotted = f"{prefix}{name}"
        section = _section_type(hint)
        keys.extend(_dotted_keys(section, dotted + ".") if section else [dotted])
    return keys


def _set_dotted(tree: dict[str, Any], cls: type, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node, section = tree, cls
    for depth, part in enumerate(parts):
        fields = _section_fields(section)
        if part not in fields:
            known = StrategyConfig.keys() + [f.name for f in dataclasses.fields(StrategyConfig)]
            raise ConfigError(
                f'Unknown config key "{dotted}".{did_you_mean(dotted, known)} '
                f"Valid keys at this level: {', '.join(fields)}."
            )
        inner = _section_type(fields[part])
        last = depth == len(parts) - 1
        if last:
            if inner is not None and isinstance(value, Mapping) and node.get(part) is not None:
                for key, sub_value in value.items():
                    _set_dotted(node[part], inner, str(key), sub_value)
            else:
                node[part] = value
            return
        if inner is None:
            raise ConfigError(
                f'Config key "{".".join(parts[: depth + 1])}" is a value, not a section, so '
                f'"{dotted}" does not exist.'
            )
        if node.get(part) is None:
            node[part] = {}
        node, section = node[part], inner


def _line_of_error(text: str, message: str) -> int | None:
    """Finds the YAML line of the key an error message names, if any."""
    match = re.search(r'"([\w.]+)"|\b((?:[a-z_]+\.)+[a-z_]+)\b', message)
    if not match:
        return None
    parts = (match.group(1) or match.group(2)).split(".")
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in parts:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == part:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            break
    return line

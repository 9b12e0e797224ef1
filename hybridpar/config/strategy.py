"""The whole strategy configuration, ``StrategyConfig`` (pure Python, no TensorFlow).

One ``StrategyConfig`` holds nested, typed, frozen sections (``sections``).
Every way of making one (``from_yaml``, ``from_dict``, ``override`` or the
constructors) goes through the same checks: unknown keys are refused with a
did-you-mean, values are type-checked and range-checked per field, and
cross-field rules run on the whole config. Checks against the devices and
cluster that exist are separate (``hybridpar.topology.plan``) and run inside
``hybridpar.scope()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml

from hybridpar.config.engine import (
    Section,
    build_section,
    dotted_keys,
    line_of_error,
    require,
    set_dotted,
)
from hybridpar.config.model_parallel import ModelParallelConfig
from hybridpar.config.sections import (
    CheckpointConfig,
    CommunicationConfig,
    DataConfig,
    DataParallelConfig,
    EvaluatorConfig,
    ParameterServerConfig,
    TrainConfig,
)
from hybridpar.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class StrategyConfig(Section):
    """The whole hybridpar configuration.

    Build it with ``from_yaml``, ``from_dict`` or the constructor; derive
    variants with ``override``. Instances are immutable.
    """

    PATH: ClassVar[str] = ""
    data_parallel: DataParallelConfig = dataclasses.field(default_factory=DataParallelConfig)
    model_parallel: ModelParallelConfig = dataclasses.field(default_factory=ModelParallelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
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
            require(
                batch % microbatches == 0,
                f"data.global_batch_size={batch} is not divisible by "
                f"model_parallel.microbatches={microbatches}. Each replica batch is split "
                "into microbatches, so choose a batch that is a multiple of it.",
            )
        devices = self.data_parallel.devices
        if devices is not None:
            require(
                len(devices) % stages == 0,
                f"data_parallel.devices lists {len(devices)} devices, which do not divide "
                f"into model_parallel.stages={stages} stages per replica. List a multiple "
                f"of {stages} devices.",
            )
            replicas = len(devices) // stages
            require(
                not (mode == "none" and replicas > 1),
                f"data_parallel.mode='none' trains one replica, but data_parallel.devices "
                f"lists {len(devices)} devices for model_parallel.stages={stages}. Use "
                "mode 'mirrored' for data parallelism, or list one device per stage.",
            )
            if batch is not None:
                check_batch_divides(batch, replicas, microbatches)
        partitioner = self.parameter_server.partitioner
        require(
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
        return build_section(cls, data, "")

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
            line = line_of_error(text, str(err))
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
            set_dotted(tree, type(self), dotted, value)
        return type(self).from_dict(tree)

    @staticmethod
    def keys() -> list[str]:
        """Every dotted key a config accepts."""
        return dotted_keys(StrategyConfig, "")


def check_batch_divides(global_batch: int, replicas: int, microbatches: int) -> None:
    """Raises ConfigError unless the global batch splits into replicas and microbatches."""
    require(
        global_batch % replicas == 0,
        f"data.global_batch_size={global_batch} does not divide evenly across "
        f"{replicas} replicas. Use a multiple of {replicas}, e.g. "
        f"{max(replicas, global_batch // replicas * replicas)}.",
    )
    per_replica = global_batch // replicas
    require(
        per_replica % microbatches == 0,
        f"The per-replica batch {per_replica} (data.global_batch_size={global_batch} / "
        f"{replicas} replicas) is not divisible by model_parallel.microbatches="
        f"{microbatches}. Use a global batch that is a multiple of "
        f"{replicas * microbatches}.",
    )



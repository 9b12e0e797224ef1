"""The declarative configuration: ``StrategyConfig`` and its sections (pure Python).

``engine`` is the typed-dataclass machinery (strict keys, did-you-mean, dotted
overrides, YAML lines); ``sections`` declares the sections the contract
promises, ``strategy`` the whole config and its cross-section rules,
``model_parallel`` the model-parallel section; ``devices`` parses device names.
"""

from hybridpar.config.engine import did_you_mean
from hybridpar.config.model_parallel import ModelParallelConfig
from hybridpar.config.sections import (
    CheckpointConfig,
    CommunicationConfig,
    DataConfig,
    DataParallelConfig,
    EvaluatorConfig,
    ParameterServerConfig,
    PartitionerConfig,
    PowerSGDConfig,
    TrainConfig,
)
from hybridpar.config.strategy import StrategyConfig, check_batch_divides

__all__ = [
    "CheckpointConfig",
    "CommunicationConfig",
    "DataConfig",
    "DataParallelConfig",
    "EvaluatorConfig",
    "ModelParallelConfig",
    "ParameterServerConfig",
    "PartitionerConfig",
    "PowerSGDConfig",
    "StrategyConfig",
    "TrainConfig",
    "check_batch_divides",
    "did_you_mean",
]

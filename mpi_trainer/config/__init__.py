"""Typed configuration: the schema (:mod:`.schema`, gathering the sections of :mod:`.data_config`,
:mod:`.training_config` and :mod:`.run_config` and the choices of :mod:`.choices`), the rules across
sections (:mod:`.rules`) and the loader (:mod:`.loader`)."""

from mpi_trainer.config.loader import all_keys, config_from_dict, load_config, parse_override, read_toml
from mpi_trainer.config.schema import (
    AggregationConfig,
    AugmentationConfig,
    CheckpointConfig,
    CommConfig,
    Config,
    DataConfig,
    EarlyStoppingConfig,
    EvaluationConfig,
    FaultConfig,
    IncrementConfig,
    LbfgsConfig,
    LogConfig,
    ModelConfig,
    TrainConfig,
    WatchdogConfig,
)
from mpi_trainer.errors import ConfigError

__all__ = [
    "AggregationConfig", "AugmentationConfig", "CheckpointConfig", "CommConfig", "Config", "ConfigError",
    "DataConfig", "EarlyStoppingConfig", "EvaluationConfig", "FaultConfig", "IncrementConfig",
    "LbfgsConfig", "LogConfig", "ModelConfig", "TrainConfig", "WatchdogConfig", "all_keys", "config_from_dict",
    "load_config", "parse_override", "read_toml",
]

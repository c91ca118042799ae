"""The config schema: :class:`Config`, one dataclass per section, with its defaults (a leaf package part).

Every section is a dataclass that validates its own keys in ``__post_init__``
so a bad value fails before any rank starts training, with the dotted key,
the value received and what was expected. Rules across sections
(:mod:`.rules`) and derived values are applied once, by the loader
(:mod:`.loader`); nothing changes a config after it is loaded, so every
rank holds the same one.

The sections live in :mod:`.data_config`, :mod:`.training_config` and :mod:`.run_config`, the values
their keys choose from in :mod:`.choices`; this module gathers them, so ``mpi_trainer.config.schema``
names every one of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from mpi_trainer.config.choices import (
    AGGREGATION_METHODS,
    ARRAYS_SOURCE,
    AUTO_OUTER_OPTIMIZER,
    BUILTIN_DATASETS,
    COLOR_MODES,
    DATA_SUFFIXES,
    DEFAULT_MONITOR,
    DEFAULT_VALIDATION_SIZE,
    DEVICES,
    EVALUATION_PLACES,
    EVERY_LOCAL_EPOCH,
    FEATURE_DTYPES,
    FLIP_MODES,
    LBFGS,
    MONITOR_MODES,
    MONITOR_PATTERN,
    NAN_POLICIES,
    OPTIMIZER_STATES,
    OUTER_LEARNING_RATES,
    OUTER_OPTIMIZERS,
    OUTPUT_ACTIVATIONS,
    PIPELINE_SOURCE,
    PLACEMENTS,
    SCHEDULER_DEVICES,
    STREAM_SUFFIXES,
    TFRECORD_SUFFIXES,
    WIRE_DTYPES,
    AggregationMethod,
    ColorMode,
    DataPlacement,
    Device,
    EvaluationPlace,
    FeatureDtype,
    FlipMode,
    MonitorMode,
    NanPolicy,
    OuterOptimizer,
    OutputActivation,
    SchedulerDevice,
    WireDtype,
)
from mpi_trainer.config.data_config import (
    AugmentationConfig,
    DataConfig,
    IncrementConfig,
)
from mpi_trainer.config.run_config import (
    PREEMPT_SIGNALS,
    CheckpointConfig,
    CommConfig,
    FaultConfig,
    LogConfig,
    WatchdogConfig,
)
from mpi_trainer.config.section import Section, reject
from mpi_trainer.config.training_config import (
    AggregationConfig,
    EarlyStoppingConfig,
    EvaluationConfig,
    LbfgsConfig,
    ModelConfig,
    TrainConfig,
)
from mpi_trainer.hooks import TestHooks

__all__ = [
    "AGGREGATION_METHODS",
    "ARRAYS_SOURCE",
    "AggregationConfig",
    "AggregationMethod",
    "AugmentationConfig",
    "BUILTIN_DATASETS",
    "COLOR_MODES",
    "CheckpointConfig",
    "ColorMode",
    "CommConfig",
    "Config",
    "DATA_SUFFIXES",
    "DEFAULT_MONITOR",
    "DEFAULT_VALIDATION_SIZE",
    "DEVICES",
    "DataConfig",
    "DataPlacement",
    "Device",
    "EVALUATION_PLACES",
    "EVERY_LOCAL_EPOCH",
    "EarlyStoppingConfig",
    "EvaluationConfig",
    "EvaluationPlace",
    "FEATURE_DTYPES",
    "FLIP_MODES",
    "FaultConfig",
    "FeatureDtype",
    "FlipMode",
    "IncrementConfig",
    "LBFGS",
    "LbfgsConfig",
    "LogConfig",
    "MONITOR_MODES",
    "MONITOR_PATTERN",
    "ModelConfig",
    "MonitorMode",
    "NAN_POLICIES",
    "NanPolicy",
    "OUTER_LEARNING_RATES",
    "OUTER_OPTIMIZERS",
    "OUTPUT_ACTIVATIONS",
    "OuterOptimizer",
    "OutputActivation",
    "PIPELINE_SOURCE",
    "PLACEMENTS",
    "PREEMPT_SIGNALS",
    "SCHEDULER_DEVICES",
    "STREAM_SUFFIXES",
    "SchedulerDevice",
    "Section",
    "TFRECORD_SUFFIXES",
    "TrainConfig",
    "OPTIMIZER_STATES",
    "WIRE_DTYPES",
    "WatchdogConfig",
    "WireDtype",
    "reject",
]


def keyed_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a config class that are keys or sections of the config, not what rides along with it."""
    return [item for item in dataclasses.fields(cls) if item.metadata.get("key", True)]


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    lbfgs: LbfgsConfig = field(default_factory=LbfgsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # The test hooks the loader took off the ``debug`` table (:mod:`mpi_trainer.hooks`): no section, never
    # written or shown, all off unless a test or benchmark set them.
    test_hooks: TestHooks = field(default_factory=TestHooks, repr=False, metadata={"key": False})

    def outer_optimizer_for(self, workers: int) -> str:
        """The outer optimizer in effect with ``workers`` workers: ``aggregation.outer_optimizer``, where
        ``"auto"`` is Nesterov for synchronous rounds that average two or more workers, and none where no
        average is stepped from (one worker, SSP, best-of election, synchronous SGD, L-BFGS)."""
        if not self.aggregation.outer_optimizer_auto:
            return self.aggregation.outer_optimizer
        averaged = workers > 1 and not (self.aggregation.ssp > 0 or self.aggregation.elects
                                        or self.aggregation.synchronous or self.model.uses_lbfgs)
        return AUTO_OUTER_OPTIMIZER if averaged else "none"

    def to_dict(self) -> dict[str, Any]:
        """The whole config as plain values (what run directories and ``check`` show)."""
        return {item.name: dataclasses.asdict(getattr(self, item.name)) for item in keyed_fields(Config)}

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

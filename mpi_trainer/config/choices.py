"""The values config keys choose from, as ``Literal`` types (with their tuples for messages), and the
constants the sections share. A leaf: it imports nothing from mpi_trainer."""

from __future__ import annotations

import re
from typing import Literal, get_args

BUILTIN_DATASETS = (
    "digits",
    "iris",
    "wine",
    "breast_cancer",
    "mnist",
    "fashion_mnist",
    "cifar10",
)
DATA_SUFFIXES = (".npz", ".h5", ".hdf5", ".csv")
STREAM_SUFFIXES = (".npz", ".h5", ".hdf5")  # data.stream: formats read in batches from disk
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords")  # data.source: a TFRecord file or a glob of them
ColorMode = Literal["grayscale", "rgb", "rgba"]
COLOR_MODES = get_args(ColorMode)
FeatureDtype = Literal["uint8", "float32"]
FEATURE_DTYPES = get_args(FeatureDtype)
# data.source of a job whose arrays were handed to mpi_trainer.fit (never read from a file).
ARRAYS_SOURCE = "arrays"
# "synchronous": synchronous SGD, the workers' gradients summed at every step (trainer/synchronous.py)
AggregationMethod = Literal["average", "weighted", "best", "synchronous"]
AGGREGATION_METHODS = get_args(AggregationMethod)
# "auto": float32, or float16 where the measured links are slow enough that halving the bytes pays for the
# casts (launch/wire_choice.py, at the job's start)
WireDtype = Literal["float32", "float16", "bfloat16", "auto"]
WIRE_DTYPES = get_args(WireDtype)
# "combined": the optimizers' moments travel and are combined by meaning each round; "local": each worker keeps
# its own (DiLoCo's inner optimizer state), only the model's state, the learning rates and an EMA travel
OptimizerState = Literal["combined", "local"]
OPTIMIZER_STATES = get_args(OptimizerState)
DataPlacement = Literal["shared", "scatter"]
PLACEMENTS = get_args(DataPlacement)
FlipMode = Literal["none", "horizontal", "vertical", "horizontal_and_vertical"]
FLIP_MODES = get_args(FlipMode)
OutputActivation = Literal["softmax", "sigmoid", "linear"]
OUTPUT_ACTIVATIONS = get_args(OutputActivation)
NanPolicy = Literal["stop", "rollback"]
NAN_POLICIES = get_args(NanPolicy)
# train.divergence: a finite divergence (loss above its start, accuracy at chance) is logged and kept in
# summary.json ("warn"), also ends the run as nan_policy = "stop" would ("stop"), or is not watched ("off")
DivergencePolicy = Literal["warn", "stop", "off"]
DIVERGENCE_POLICIES = get_args(DivergencePolicy)
# data.source of a job whose data was handed to mpi_trainer.fit as a pipeline (tf.data, PyDataset, generator).
PIPELINE_SOURCE = "pipeline"
MONITOR_PATTERN = re.compile(r"(test|val)_[A-Za-z0-9_]+")
MonitorMode = Literal["auto", "min", "max"]
MONITOR_MODES = get_args(MonitorMode)
EvaluationPlace = Literal["auto", "scheduler", "workers"]
EVALUATION_PLACES = get_args(EvaluationPlace)
EVERY_LOCAL_EPOCH = 0  # evaluation.every: score once per local epoch
DEFAULT_MONITOR = "test_accuracy"
# Held out for validation when best-of election or a val_* monitor needs it and data.validation_size is 0.
DEFAULT_VALIDATION_SIZE = 0.1
# ``model.optimizer`` value that selects full-batch distributed L-BFGS instead of a Keras optimizer.
LBFGS = "lbfgs"
Device = Literal["auto", "cpu", "gpu"]
DEVICES = get_args(Device)
SchedulerDevice = Literal["cpu", "gpu"]
SCHEDULER_DEVICES = get_args(SchedulerDevice)
OuterOptimizer = Literal["auto", "none", "momentum", "nesterov", "adam"]
OUTER_OPTIMIZERS = get_args(OuterOptimizer)
# aggregation.outer_optimizer = "auto" (the default): Nesterov where rounds average 2+ workers, else none
# (docs/outer-optimizer.md says why: it reached a target in fewer local epochs on real MNIST).
AUTO_OUTER_OPTIMIZER = "nesterov"
# aggregation.outer_learning_rate when left at 0: each outer optimizer's default (docs/outer-optimizer.md)
OUTER_LEARNING_RATES = {"auto": 1.0, "none": 1.0, "momentum": 1.0, "nesterov": 1.0, "adam": 0.01}

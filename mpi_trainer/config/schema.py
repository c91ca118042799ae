"""The config schema: one dataclass per section, with its defaults (a leaf module).

Every section is a dataclass that validates its own keys in ``__post_init__``
so a bad value fails before any rank starts training, with the dotted key,
the value received and what was expected. Rules across sections
(:mod:`.rules`) and derived values are applied once, by the loader
(:mod:`.loader`); nothing changes a config after it is loaded, so every
rank holds the same one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import tomli_w

from mpi_trainer.errors import ConfigError

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
AggregationMethod = Literal["average", "weighted", "best"]
AGGREGATION_METHODS = get_args(AggregationMethod)
WireDtype = Literal["float32", "float16", "bfloat16"]
WIRE_DTYPES = get_args(WireDtype)
DataPlacement = Literal["shared", "scatter"]
PLACEMENTS = get_args(DataPlacement)
FlipMode = Literal["none", "horizontal", "vertical", "horizontal_and_vertical"]
FLIP_MODES = get_args(FlipMode)
OutputActivation = Literal["softmax", "sigmoid", "linear"]
OUTPUT_ACTIVATIONS = get_args(OutputActivation)
NanPolicy = Literal["stop", "rollback"]
NAN_POLICIES = get_args(NanPolicy)
# data.source of a job whose data was handed to mpi_trainer.fit as a pipeline (tf.data, PyDataset, generator).
PIPELINE_SOURCE = "pipeline"
MONITOR_PATTERN = re.compile(r"(test|val)_[A-Za-z0-9_]+")
MonitorMode = Literal["auto", "min", "max"]
MONITOR_MODES = get_args(MonitorMode)
EvaluationPlace = Literal["scheduler", "workers"]
EVALUATION_PLACES = get_args(EvaluationPlace)
CrashPhase = Literal["train", "contribute"]
CRASH_PHASES = get_args(CrashPhase)
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
OuterOptimizer = Literal["none", "momentum", "nesterov", "adam"]
OUTER_OPTIMIZERS = get_args(OuterOptimizer)
# aggregation.outer_learning_rate when left at 0: each outer optimizer's default (docs/outer-optimizer.md)
OUTER_LEARNING_RATES = {"none": 1.0, "momentum": 1.0, "nesterov": 1.0, "adam": 0.01}


# Field metadata flag of a section that is accepted and validated but left out of the public schema.
HIDDEN = "hidden"


def public_fields(cls: type) -> list[dataclasses.Field]:
    """A dataclass's fields without the hidden ones (the test hooks)."""
    return [item for item in dataclasses.fields(cls) if not item.metadata.get(HIDDEN)]


def reject(key: str, value: Any, expected: str) -> None:
    """Raise the Keras-style error for one key: what is expected, then the value received."""
    raise ConfigError(f"`{key}` {expected}. Received: {key}={value!r}")


class _Section:
    prefix: ClassVar[str] = ""

    def _key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def _require(self, ok: bool, name: str, expected: str) -> None:
        if not ok:
            reject(self._key(name), getattr(self, name), expected)

    def _positive(self, *names: str) -> None:
        for name in names:
            self._require(getattr(self, name) > 0, name, "must be > 0")

    def _non_negative(self, *names: str) -> None:
        for name in names:
            self._require(getattr(self, name) >= 0, name, "must be >= 0")

    def _fraction(self, name: str, low_open: bool = True) -> None:
        value = getattr(self, name)
        ok = (0 < value < 1) if low_open else (0 <= value < 1)
        interval = "the open interval (0, 1)" if low_open else "the interval [0, 1)"
        self._require(ok, name, f"must lie in {interval}")

    def _choice(self, name: str, choices: tuple[str, ...]) -> None:
        self._require(getattr(self, name) in choices, name, f"must be one of {list(choices)}")


@dataclass
class IncrementConfig(_Section):
    """Random data increment: each round a worker adds a seeded random draw to its fixed block."""

    prefix: ClassVar[str] = "data.increment"
    enabled: bool = False
    load_factor: float = 0.05
    absolute_factor: float = 0.8
    min_gap: int = 0

    def __post_init__(self) -> None:
        self._require(0 < self.load_factor <= 1, "load_factor", "must lie in (0, 1]")
        self._require(0 < self.absolute_factor <= 1, "absolute_factor", "must lie in (0, 1]")
        self._non_negative("min_gap")


@dataclass
class AugmentationConfig(_Section):
    """Real-time image augmentation on workers, during training only."""

    prefix: ClassVar[str] = "data.augmentation"
    enabled: bool = False
    shift: float = 0.1
    rotation: float = 0.0
    zoom: float = 0.0
    flip: FlipMode = "none"

    def __post_init__(self) -> None:
        for name in ("shift", "rotation", "zoom"):
            self._fraction(name, low_open=False)
        self._choice("flip", FLIP_MODES)


@dataclass
class DataConfig(_Section):
    prefix: ClassVar[str] = "data"
    source: str = "digits"
    test_size: float = 0.2  # 0: nothing held out for testing (the test_* columns stay empty)
    # 0: no validation split unless best-of or a val_* monitor needs one (then DEFAULT_VALIDATION_SIZE)
    validation_size: float = 0.0
    placement: DataPlacement = "shared"
    label: str = ""
    features: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    rebalance: bool = False
    rebalance_smoothing: float = 0.5
    # read the training rows in batches from disk, blocks as row ranges (.h5 / .hdf5 / uncompressed .npz)
    stream: bool = False
    # an image folder (data.source a directory, laid out as keras.utils.image_dataset_from_directory reads it)
    image_size: list[int] = field(default_factory=lambda: [256, 256])
    color_mode: ColorMode = "rgb"
    # TFRecords: data.features names the feature holding a sample, data.label its class index
    feature_shape: list[int] = field(default_factory=list)
    feature_dtype: FeatureDtype = "uint8"
    increment: IncrementConfig = field(default_factory=IncrementConfig)
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)

    def __post_init__(self) -> None:
        self._fraction("test_size", low_open=False)  # 0: no test split (mpi_trainer.fit's default for arrays)
        self._fraction("validation_size", low_open=False)
        self._choice("placement", PLACEMENTS)
        self._require(len(self.datasets) in (0, 2, 4), "datasets",
                      "must list 4 array names (x_train, y_train, x_test, y_test) or 2 (x, y)")
        self._require(0 < self.rebalance_smoothing <= 1, "rebalance_smoothing",
                      "must lie in the interval (0, 1]")
        if self.is_image_folder or self.is_tfrecord:
            self._check_pipeline_source()
        elif self.is_file:
            path = Path(self.source).expanduser()
            self._require(
                path.suffix.lower() in DATA_SUFFIXES,
                "source",
                f"must be a built-in dataset {list(BUILTIN_DATASETS)} "
                f"or a file ending in one of {list(DATA_SUFFIXES)}",
            )
            # Under scatter only rank 0 reads the file (it checks it exists when it opens it).
            self._require(path.is_file() or self.scatters, "source",
                          "names a data file that does not exist")
        elif self.source not in (ARRAYS_SOURCE, PIPELINE_SOURCE):
            self._choice("source", BUILTIN_DATASETS)
        for name in ("label", "features"):
            self._require(self.is_csv or self.is_tfrecord or not getattr(self, name), name,
                          "applies to .csv and TFRecord sources only")
        self._require(not self.stream or (self.is_file and Path(self.source).suffix.lower() in STREAM_SUFFIXES),
                      "stream", f"applies to data files ending in one of {list(STREAM_SUFFIXES)}; the data.source "
                      f"{self.source!r} is read whole (or pass a pipeline to mpi_trainer.fit)")

    def _check_pipeline_source(self) -> None:
        """An image folder or TFRecords: read as a tf.data pipeline, which needs its shapes up front."""
        self._choice("color_mode", COLOR_MODES)
        self._require(len(self.image_size) == 2 and all(int(s) > 0 for s in self.image_size), "image_size",
                      "must be [height, width], both > 0")
        if self.is_tfrecord:
            self._require(len(self.features) == 1, "features", "must name the one TFRecord feature that holds "
                                                               "a sample, e.g. ['image']")
            self._require(bool(self.label), "label", "must name the TFRecord feature that holds the class index")
            self._require(len(self.feature_shape) > 0 and all(int(s) > 0 for s in self.feature_shape),
                          "feature_shape", "must give one sample's shape, e.g. [28, 28, 1]")
            self._choice("feature_dtype", FEATURE_DTYPES)

    @property
    def is_image_folder(self) -> bool:
        """``source`` is a directory of class sub-directories of images."""
        return self.source not in ("", ".") and Path(self.source).expanduser().is_dir()

    @property
    def is_tfrecord(self) -> bool:
        """``source`` is a TFRecord file or a glob of them (``data/train-*.tfrecord``)."""
        return Path(self.source).suffix.lower() in TFRECORD_SUFFIXES

    @property
    def scatters(self) -> bool:
        """``placement = "scatter"``: rank 0 reads the data and sends each worker its rows."""
        return self.placement == "scatter"

    @property
    def is_file(self) -> bool:
        return "/" in self.source or Path(self.source).suffix != ""

    @property
    def is_csv(self) -> bool:
        return self.is_file and Path(self.source).suffix.lower() == ".csv"


@dataclass
class ModelConfig(_Section):
    prefix: ClassVar[str] = "model"
    name: str = "mlp"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    activation: OutputActivation = "softmax"
    # "cross_entropy" / "squared_error" (chosen for the labels, see models.implied_loss) or any Keras loss
    # identifier; checked against Keras when the model is built, before training.
    loss: str = "cross_entropy"
    # Keras metric identifiers; empty = accuracy for class labels and cross-entropy, none for regression.
    metrics: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._positive("learning_rate")
        self._choice("activation", OUTPUT_ACTIVATIONS)
        self._require(bool(self.loss), "loss", "must name a loss: 'cross_entropy', 'squared_error' or a Keras loss")
        self._require(all(isinstance(m, str) and m for m in self.metrics), "metrics",
                      "must list Keras metric identifiers such as 'accuracy' or 'mae'")
        self._require(bool(self.name), "name", "must name a zoo model or `package.module:function`")
        self._require(bool(self.optimizer), "optimizer", "must name a Keras optimizer or 'lbfgs'")

    @property
    def uses_lbfgs(self) -> bool:
        """Full-batch L-BFGS (``optimizer = "lbfgs"``) instead of a Keras optimizer."""
        return self.optimizer == LBFGS



@dataclass
class TrainConfig(_Section):
    prefix: ClassVar[str] = "train"
    epochs: int = 20
    batch_size: int = 32
    seed: int = 0
    # Each worker visits its block in a new random order every local epoch (false: in row order).
    shuffle: bool = True
    # Total optimizer steps (batches, summed over workers) after which the run stops; 0 = no limit.
    max_steps: int = 0
    # Local optimizer steps per round (0 = one local epoch per round). At k > 0 each worker walks
    # its block in a shuffled order that carries on from round to round.
    sync_every: int = 0
    # Post-local SGD: for the first ``sync_warmup_epochs`` local epochs (0 = no warm-up) every round is
    # ``sync_warmup_every`` steps; ``sync_every`` applies after. Rounds stay synchronisations.
    sync_warmup_epochs: int = 0
    sync_warmup_every: int = 1
    nan_policy: NanPolicy = "stop"
    # Synchronous rounds: start round r+1 before evaluating round r, so the workers do not wait
    # for the scheduler's evaluation. Early stopping then decides one round late (that round is
    # discarded); rounds followed by a checkpoint are not overlapped.
    overlap_eval: bool = False
    # Each worker's backend threads; 0 = the node's cores divided by the workers on it.
    threads: int = 0
    # Where a node's CPU workers fill its cores, each keeps to its own (as many as its threads),
    # unless mpirun bound it already; false leaves every rank free to run on any core.
    bind_cores: bool = True
    # Workers: a GPU of their node when it has one (auto), or always the CPU, or a GPU or fail (gpu).
    device: Device = "auto"
    # The scheduler aggregates in NumPy and evaluates; it takes a GPU only when asked to.
    scheduler_device: SchedulerDevice = "cpu"

    def __post_init__(self) -> None:
        self._positive("epochs", "batch_size")
        self._non_negative("seed", "max_steps", "threads", "sync_every", "sync_warmup_epochs")
        self._positive("sync_warmup_every")
        self._choice("nan_policy", NAN_POLICIES)
        self._choice("device", DEVICES)
        self._choice("scheduler_device", SCHEDULER_DEVICES)


@dataclass
class AggregationConfig(_Section):
    prefix: ClassVar[str] = "aggregation"
    method: AggregationMethod = "average"
    ssp: int = 0
    staleness_damping: bool = False
    # The dtype weights travel in; the global model and every sum stay float32.
    wire_dtype: WireDtype = "float32"
    # The step from each round's aggregate to the next global model (docs/outer-optimizer.md);
    # outer_learning_rate = 0 takes the outer optimizer's own default (OUTER_LEARNING_RATES).
    outer_optimizer: OuterOptimizer = "none"
    outer_learning_rate: float = 0.0
    outer_momentum: float = 0.5
    outer_beta_1: float = 0.9
    outer_beta_2: float = 0.999
    outer_epsilon: float = 1e-7

    def __post_init__(self) -> None:
        self._choice("method", AGGREGATION_METHODS)
        self._non_negative("ssp")
        self._choice("wire_dtype", WIRE_DTYPES)
        self._choice("outer_optimizer", OUTER_OPTIMIZERS)
        self._require(self.outer_learning_rate >= 0, "outer_learning_rate",
                      "must be > 0, or 0 for the outer optimizer's default")
        self._non_negative("outer_epsilon")
        if self.outer_learning_rate == 0:
            self.outer_learning_rate = OUTER_LEARNING_RATES[self.outer_optimizer]
        self._require(0 <= self.outer_momentum < 1, "outer_momentum", "must lie in the interval [0, 1)")
        for name in ("outer_beta_1", "outer_beta_2"):
            self._fraction(name, low_open=False)

    @property
    def elects(self) -> bool:
        """Best-of: one worker's weights are elected (on the validation split) instead of averaged."""
        return self.method == "best"


@dataclass
class EarlyStoppingConfig(_Section):
    prefix: ClassVar[str] = "early_stopping"
    patience: int = 0
    min_delta: float = 0.0
    monitor: str = DEFAULT_MONITOR
    # min: smaller is better; max: larger; auto: from the name (losses and errors min, scores max)
    mode: MonitorMode = "auto"

    def __post_init__(self) -> None:
        self._non_negative("patience", "min_delta")
        self._require(MONITOR_PATTERN.fullmatch(self.monitor) is not None, "monitor",
                      "must be test_<metric> or val_<metric>, e.g. 'test_accuracy', 'val_loss' or 'test_mae'")
        self._choice("mode", MONITOR_MODES)


@dataclass
class EvaluationConfig(_Section):
    """How often the global model is scored on the test split, and by whom.

    ``every = 0`` (the default) scores once per local epoch, as Keras ``fit``
    does: every round when a round is a local epoch; at ``train.sync_every = k``,
    where a round is k steps and scoring every round would cost more than the
    training, the round that completes a local epoch of the largest block.
    ``every = n`` scores every n-th round. The last round is always scored.
    Rounds in between have empty test columns, and early stopping counts scored
    rounds only.
    """

    prefix: ClassVar[str] = "evaluation"
    every: int = EVERY_LOCAL_EPOCH
    # "workers": each worker scores its shard of the test (and validation) split and the metric
    # states are summed, so the scheduler does not score alone while the workers wait.
    where: EvaluationPlace = "scheduler"

    def __post_init__(self) -> None:
        self._non_negative("every")
        self._choice("where", EVALUATION_PLACES)

    @property
    def on_workers(self) -> bool:
        """``where = "workers"``: each worker scores its shard and the metric states are summed."""
        return self.where == "workers"


PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


@dataclass
class CheckpointConfig(_Section):
    """When rank 0 checkpoints: every ``every`` rounds (0: off), after any round that ends at least
    ``every_seconds`` after the last checkpoint (0: off), at the end, and on preemption: one of
    ``preempt_signals`` makes the job checkpoint after the current round and exit 75, or exit 75
    anyway ``grace_seconds`` after the signal (0: no limit)."""

    prefix: ClassVar[str] = "checkpoint"
    every: int = 0
    every_seconds: float = 120.0
    grace_seconds: float = 25.0
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])

    def __post_init__(self) -> None:
        self._non_negative("every", "every_seconds", "grace_seconds")
        self._require(isinstance(self.preempt_signals, list) and all(
            s in PREEMPT_SIGNALS for s in self.preempt_signals), "preempt_signals",
            f"must be a list of signal names from {list(PREEMPT_SIGNALS)} (empty: no preemption handling)")


@dataclass
class CommConfig(_Section):
    prefix: ClassVar[str] = "comm"
    # Longest sleep between two polls of a pending MPI request, in seconds. Polling keeps a
    # waiting rank off the CPU; 0 selects plain blocking MPI waits, which spin a core.
    poll_interval: float = 0.005

    def __post_init__(self) -> None:
        self._non_negative("poll_interval")
        self._require(self.poll_interval <= 1.0, "poll_interval", "must be <= 1 second")


@dataclass
class WatchdogConfig(_Section):
    """Seconds a rank waits for its peers before it names them and ends the job.

    0 = the default bound (mpi_trainer.algorithms.wait_bounds): ``setup_timeout`` 600 s for
    set-up and the first round; ``worker_timeout`` 10 x the slowest round so far, at least
    60 s. ``stall_seconds`` (launcher only): seconds without a new round before a restart; 0 = the
    default, 3 x 10 x the longest gap between rounds so far, at least 180 s, armed from the first
    round until the run is complete (wait_bounds.StallWatch).
    """

    prefix: ClassVar[str] = "watchdog"
    worker_timeout: float = 0.0
    setup_timeout: float = 0.0
    stall_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._non_negative("worker_timeout", "setup_timeout", "stall_seconds")


@dataclass
class FaultConfig(_Section):
    """Surviving a lost worker inside the running job (Open MPI's fault-tolerant MPI, ULFM).

    ``survive``: when a worker rank dies, the scheduler and the other workers shrink the job to
    the survivors, re-plan the blocks and train the interrupted round again from its starting
    weights (docs/fault-tolerance.md); ``launch`` starts mpirun with the options this needs.
    ``min_workers``: below this many workers the job checkpoints and exits for ``launch`` to restart.
    """

    prefix: ClassVar[str] = "fault"
    survive: bool = False
    min_workers: int = 1

    def __post_init__(self) -> None:
        self._require(isinstance(self.survive, bool), "survive", "must be true or false")
        self._positive("min_workers")


@dataclass
class LbfgsConfig(_Section):
    """Full-batch L-BFGS (``model.optimizer = "lbfgs"``); ``train.epochs`` is the iteration limit.

    ``history_size`` is the number of correction pairs L-BFGS keeps (SciPy's
    ``maxcor``); ``gtol`` stops when the largest gradient component falls below
    it, ``ftol`` when the relative loss decrease does; ``max_evaluations``
    bounds the loss-and-gradient evaluations (each one MPI round trip).
    ``batch_size`` is how many rows a worker pushes through the model at once
    while it sums its block's gradient: it bounds memory, not the result.
    """

    prefix: ClassVar[str] = "lbfgs"
    history_size: int = 10
    gtol: float = 1e-5
    ftol: float = 2.220446049250313e-09
    max_evaluations: int = 15000
    batch_size: int = 4096

    def __post_init__(self) -> None:
        self._positive("history_size", "max_evaluations", "batch_size")
        self._non_negative("gtol", "ftol")


@dataclass
class LogConfig(_Section):
    """Console verbosity, and what rank 0 writes to see a run (docs/observability.md).

    ``plots`` runs the report (PNG plots and report.txt) at the end of ``train``;
    ``tensorboard`` writes per-round scalars as TensorBoard event files;
    ``timeline`` writes every rank's phases per round as a Chrome trace.
    """

    prefix: ClassVar[str] = "log"
    verbosity: int = 1
    plots: bool = True
    tensorboard: bool = True
    timeline: bool = False

    def __post_init__(self) -> None:
        self._require(self.verbosity in (0, 1, 2), "verbosity", "must be 0, 1 or 2")


@dataclass
class DebugConfig(_Section):
    """Test hooks: testing and benchmarking aids, off by default and outside the normal training path.

    They are not part of the public schema: ``check``, a run directory's
    config.toml, summary.json and the unknown-key hints leave them out, but
    ``--set debug.<name>=...`` (or a ``[debug]`` table) still sets them.

    ``batch_delay`` makes every worker sleep that many seconds after each
    training batch: simulated per-batch work, so that benchmarks on a small,
    busy machine measure scheduling rather than CPU contention. Each rank in
    ``slow_ranks`` then takes ``slow_factor`` times as long per batch (batch
    plus delay) and plays a straggler. ``async_engine`` runs the bounded-staleness
    engine even at ``aggregation.ssp = 0``, to check it against the synchronous one.
    ``nan_rank`` (0 = off) poisons that worker's weights with NaN in round
    ``nan_round``, to exercise the NaN guard. ``reset_optimizer`` zeroes every
    worker's optimizer state at the start of each synchronous round instead of
    carrying it across averagings, to measure what carrying it is worth.
    ``crash_rank`` (0 = off) ends that worker (its starting rank) as ``kill -9`` would, in round
    ``crash_round``: at the start of its training (``crash_phase = "train"``) or after it sent its
    report, before its weights go out (``"contribute"``), to exercise ``fault.survive``.
    ``freeze_rank`` (-1 = off) stops that rank with SIGSTOP, as a hung process would
    stop: during set-up when ``freeze_round`` is -1, else once its part of round
    ``freeze_round`` is done (a worker then sits idle; SSP counts its updates).
    """

    prefix: ClassVar[str] = "debug"
    slow_ranks: list[int] = field(default_factory=list)
    slow_factor: float = 1.0
    batch_delay: float = 0.0
    async_engine: bool = False
    nan_rank: int = 0
    nan_round: int = 0
    reset_optimizer: bool = False
    crash_rank: int = 0
    crash_round: int = 0
    crash_phase: CrashPhase = "contribute"
    freeze_rank: int = -1
    freeze_round: int = -1

    def __post_init__(self) -> None:
        self._require(self.slow_factor >= 1, "slow_factor", "must be >= 1 (1 = normal speed)")
        self._require(self.freeze_rank >= -1, "freeze_rank", "must be a rank, or -1 (off)")
        self._require(self.freeze_round >= -1, "freeze_round", "must be a round, or -1 (during set-up)")
        self._non_negative("batch_delay", "nan_rank", "nan_round", "crash_rank", "crash_round")
        self._choice("crash_phase", CRASH_PHASES)
        self._require(all(rank >= 1 for rank in self.slow_ranks), "slow_ranks",
                      "must list worker ranks (each >= 1; rank 0 is the scheduler)")


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
    # Test hooks: settable, validated, never shown (see DebugConfig).
    debug: DebugConfig = field(default_factory=DebugConfig, metadata={HIDDEN: True})

    def to_dict(self) -> dict[str, Any]:
        """The public config, test hooks left out (what run directories and ``check`` show)."""
        return {item.name: dataclasses.asdict(getattr(self, item.name)) for item in public_fields(Config)}

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

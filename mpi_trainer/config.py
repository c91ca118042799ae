"""Typed configuration: defaults < TOML file < ``--set`` overrides.

Every section is a dataclass that validates itself in ``__post_init__`` so a
bad value fails before any rank starts training, with the dotted key, the
value received and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

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
AGGREGATION_METHODS = ("average", "weighted", "best")
PLACEMENTS = ("shared", "scatter")
FLIP_MODES = ("none", "horizontal", "vertical", "horizontal_and_vertical")
OUTPUT_ACTIVATIONS = ("softmax", "sigmoid")
LOSSES = ("cross_entropy", "squared_error")
NAN_POLICIES = ("stop", "rollback")
MONITORS = ("test_accuracy", "test_loss", "val_accuracy", "val_loss")


def _fail(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"`{key}` {expected}. Received: {key}={value!r}")


class _Section:
    prefix: ClassVar[str] = ""

    def _key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def _require(self, ok: bool, name: str, expected: str) -> None:
        if not ok:
            _fail(self._key(name), getattr(self, name), expected)

    def _positive(self, *names: str) -> None:
        for name in names:
            self._require(getattr(self, name) > 0, name, "must be > 0")

    def _non_negative(self, *names: str) -> None:
        for name in names:
            self._require(getattr(self, name) >= 0, name, "must be >= 0")

    def _fraction(self, name: str, low_open: bool = True) -> None:
        value = getattr(self, name)
        ok = (0 < value < 1) if low_open else (0 <= value < 1)
        interval = "(0, 1)" if low_open else "[0, 1)"
        self._require(ok, name, f"must lie in the open interval {interval}")

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
    flip: str = "none"

    def __post_init__(self) -> None:
        for name in ("shift", "rotation", "zoom"):
            self._fraction(name, low_open=False)
        self._choice("flip", FLIP_MODES)


@dataclass
class DataConfig(_Section):
    prefix: ClassVar[str] = "data"
    source: str = "digits"
    test_size: float = 0.2
    validation_size: float = 0.1
    placement: str = "shared"
    label: str = ""
    features: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    rebalance: bool = False
    rebalance_smoothing: float = 0.5
    increment: IncrementConfig = field(default_factory=IncrementConfig)
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)

    def __post_init__(self) -> None:
        self._fraction("test_size")
        self._fraction("validation_size", low_open=False)
        self._choice("placement", PLACEMENTS)
        self._require(len(self.datasets) in (0, 2, 4), "datasets",
                      "must list 4 array names (x_train, y_train, x_test, y_test) or 2 (x, y)")
        self._require(0 < self.rebalance_smoothing <= 1, "rebalance_smoothing",
                      "must lie in the interval (0, 1]")
        if self.is_file:
            path = Path(self.source).expanduser()
            self._require(
                path.suffix.lower() in DATA_SUFFIXES,
                "source",
                f"must be a built-in dataset {list(BUILTIN_DATASETS)} "
                f"or a file ending in one of {list(DATA_SUFFIXES)}",
            )
            # Under scatter only rank 0 reads the file (it checks it exists when it opens it).
            self._require(path.is_file() or self.placement == "scatter", "source",
                          "names a data file that does not exist")
        else:
            self._choice("source", BUILTIN_DATASETS)
        for name in ("label", "features"):
            self._require(self.is_csv or not getattr(self, name), name, "applies to .csv sources only")

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
    activation: str = "softmax"
    loss: str = "cross_entropy"

    def __post_init__(self) -> None:
        self._positive("learning_rate")
        self._choice("activation", OUTPUT_ACTIVATIONS)
        self._choice("loss", LOSSES)
        self._require(bool(self.name), "name", "must name a zoo model or `package.module:function`")
        self._require(bool(self.optimizer), "optimizer", "must name a Keras optimizer")


@dataclass
class TrainConfig(_Section):
    prefix: ClassVar[str] = "train"
    epochs: int = 20
    batch_size: int = 32
    seed: int = 0
    # Total optimizer steps (batches, summed over workers) after which the run stops; 0 = no limit.
    max_steps: int = 0
    nan_policy: str = "stop"
    # Synchronous rounds: start round r+1 before evaluating round r, so the workers do not wait
    # for the scheduler's evaluation. Early stopping then decides one round late (that round is
    # discarded); rounds followed by a checkpoint are not overlapped.
    overlap_eval: bool = False

    def __post_init__(self) -> None:
        self._positive("epochs", "batch_size")
        self._non_negative("seed", "max_steps")
        self._choice("nan_policy", NAN_POLICIES)


@dataclass
class AggregationConfig(_Section):
    prefix: ClassVar[str] = "aggregation"
    method: str = "average"
    ssp: int = 0
    staleness_damping: bool = False

    def __post_init__(self) -> None:
        self._choice("method", AGGREGATION_METHODS)
        self._non_negative("ssp")


@dataclass
class EarlyStoppingConfig(_Section):
    prefix: ClassVar[str] = "early_stopping"
    patience: int = 0
    min_delta: float = 0.0
    monitor: str = "test_accuracy"

    def __post_init__(self) -> None:
        self._non_negative("patience", "min_delta")
        self._choice("monitor", MONITORS)


@dataclass
class CheckpointConfig(_Section):
    prefix: ClassVar[str] = "checkpoint"
    every: int = 0

    def __post_init__(self) -> None:
        self._non_negative("every")


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
    """Seconds without progress before a rank or the launcher gives up; 0 = wait forever."""

    prefix: ClassVar[str] = "watchdog"
    worker_timeout: float = 0.0
    stall_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._non_negative("worker_timeout", "stall_seconds")



@dataclass
class LogConfig(_Section):
    prefix: ClassVar[str] = "log"
    verbosity: int = 1

    def __post_init__(self) -> None:
        self._require(self.verbosity in (0, 1, 2), "verbosity", "must be 0, 1 or 2")


@dataclass
class DebugConfig(_Section):
    """Testing and benchmarking aids, off by default and outside the normal training path.

    ``batch_delay`` makes every worker sleep that many seconds after each
    training batch: simulated per-batch work, so that benchmarks on a small,
    busy machine measure scheduling rather than CPU contention. Each rank in
    ``slow_ranks`` then takes ``slow_factor`` times as long per batch (batch
    plus delay) and plays a straggler. ``async_engine`` runs the bounded-staleness
    engine even at ``aggregation.ssp = 0``, to check it against the synchronous one.
    ``nan_rank`` (0 = off) poisons that worker's weights with NaN in round
    ``nan_round``, to exercise the NaN guard.
    """

    prefix: ClassVar[str] = "debug"
    slow_ranks: list[int] = field(default_factory=list)
    slow_factor: float = 1.0
    batch_delay: float = 0.0
    async_engine: bool = False
    nan_rank: int = 0
    nan_round: int = 0

    def __post_init__(self) -> None:
        self._require(self.slow_factor >= 1, "slow_factor", "must be >= 1 (1 = normal speed)")
        self._non_negative("batch_delay", "nan_rank", "nan_round")
        self._require(all(rank >= 1 for rank in self.slow_ranks), "slow_ranks",
                      "must list worker ranks (each >= 1; rank 0 is the scheduler)")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    log: LogConfig = field(default_factory=LogConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self) -> None:
        ssp = self.aggregation.ssp
        if ssp > 0 and self.train.max_steps > 0:
            raise ConfigError("`train.max_steps` splits the last synchronous round into step budgets and needs "
                              f"aggregation.ssp = 0. Received: train.max_steps={self.train.max_steps} with "
                              f"aggregation.ssp={ssp}")
        if ssp > 0 and self.train.nan_policy == "rollback":
            raise ConfigError("`train.nan_policy` = 'rollback' re-runs a synchronous round and needs "
                              f"aggregation.ssp = 0 (under SSP use 'stop'). Received: train.nan_policy='rollback' "
                              f"with aggregation.ssp={ssp}")
        if self.data.rebalance and self.aggregation.ssp > 0:
            raise ConfigError("`data.rebalance` re-cuts blocks between synchronous rounds and needs "
                              f"aggregation.ssp = 0. Received: data.rebalance=True with "
                              f"aggregation.ssp={self.aggregation.ssp}")
        if self.data.rebalance and self.debug.async_engine:
            raise ConfigError("`data.rebalance` re-cuts blocks between synchronous rounds, which the SSP engine "
                              "does not run. Received: data.rebalance=True with debug.async_engine=True")
        if self.aggregation.staleness_damping and (ssp == 0 or self.aggregation.method == "best"):
            raise ConfigError("`aggregation.staleness_damping` scales merged SSP updates, so it needs "
                              "aggregation.ssp > 0 and method 'average' or 'weighted'. Received: "
                              f"aggregation.staleness_damping=True with aggregation.ssp={ssp} and "
                              f"aggregation.method={self.aggregation.method!r}")
        needs_validation = {
            "aggregation.method": (self.aggregation.method == "best", "'best' elects on the validation split"),
            "early_stopping.monitor": (self.early_stopping.monitor.startswith("val_"),
                                       f"{self.early_stopping.monitor!r} is measured on the validation split"),
        }
        for key, (needed, why) in needs_validation.items():
            if needed and self.data.validation_size == 0:
                raise ConfigError(f"`data.validation_size` must be > 0 because `{key}` = {why}. "
                                  f"Received: data.validation_size=0.0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key the configuration accepts, e.g. ``train.epochs``."""
    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        if name == "prefix":
            continue
        dotted = f"{prefix}{name}"
        if dataclasses.is_dataclass(hint):
            keys.extend(all_keys(hint, dotted + "."))
        else:
            keys.append(dotted)
    return keys


def _unknown_key(dotted: str) -> ConfigError:
    close = difflib.get_close_matches(dotted, all_keys(), n=1, cutoff=0.6)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return ConfigError(f"Unknown config key `{dotted}`.{hint} Known keys: {', '.join(all_keys())}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        ok = isinstance(value, list)
        value = [_coerce(v, item, key) for v in value] if ok else value
    else:
        raise TypeError(f"unsupported config type {hint!r} for {key}")
    if not ok:
        _fail(key, value, f"must be of type {getattr(hint, '__name__', str(hint))}")
    return value


def _build(cls: type, table: Any, prefix: str) -> Any:
    if not isinstance(table, dict):
        _fail(prefix.rstrip("."), table, "must be a table of keys")
    hints = {k: v for k, v in typing.get_type_hints(cls).items() if k != "prefix"}
    for name in table:
        if name not in hints:
            raise _unknown_key(f"{prefix}{name}")
    kwargs = {}
    for name, value in table.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``a.b=v``; ``v`` is read as a TOML value, else taken as a bare string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"`--set` expects KEY=VALUE such as train.epochs=5. Received: {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _apply_override(table: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = table
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _unknown_key(key)
        node = child
    node[leaf] = value


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found. Received: {str(path)!r}; expected an existing TOML file")
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Cannot parse config file {str(path)!r}: {exc}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read ``path`` (TOML), apply ``KEY=VALUE`` overrides and validate."""
    table = read_toml(path) if path is not None else {}
    for text in overrides or []:
        _apply_override(table, *parse_override(text))
    return _build(Config, table, "")


def config_from_dict(table: dict[str, Any]) -> Config:
    return _build(Config, table, "")

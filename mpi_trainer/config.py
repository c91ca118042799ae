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
class DataConfig(_Section):
    prefix: ClassVar[str] = "data"
    source: str = "digits"
    test_size: float = 0.2
    validation_size: float = 0.1

    def __post_init__(self) -> None:
        self._fraction("test_size")
        self._fraction("validation_size", low_open=False)
        if self.is_file:
            path = Path(self.source).expanduser()
            self._require(
                path.suffix.lower() in DATA_SUFFIXES,
                "source",
                f"must be a built-in dataset {list(BUILTIN_DATASETS)} "
                f"or a file ending in one of {list(DATA_SUFFIXES)}",
            )
            self._require(path.is_file(), "source", "names a data file that does not exist")
        else:
            self._choice("source", BUILTIN_DATASETS)

    @property
    def is_file(self) -> bool:
        return "/" in self.source or Path(self.source).suffix != ""


@dataclass
class ModelConfig(_Section):
    prefix: ClassVar[str] = "model"
    name: str = "mlp"
    optimizer: str = "adam"
    learning_rate: float = 1e-3

    def __post_init__(self) -> None:
        self._positive("learning_rate")
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

    def __post_init__(self) -> None:
        self._positive("epochs", "batch_size")
        self._non_negative("seed", "max_steps")
        self._choice("nan_policy", NAN_POLICIES)


@dataclass
class AggregationConfig(_Section):
    prefix: ClassVar[str] = "aggregation"
    method: str = "average"
    ssp: int = 0

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
class WatchdogConfig(_Section):
    """Seconds without progress before a rank or the launcher gives up; 0 = wait forever."""

    prefix: ClassVar[str] = "watchdog"
    worker_timeout: float = 0.0
    stall_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._non_negative("worker_timeout", "stall_seconds")


@dataclass
class DebugConfig(_Section):
    """Fault injection for tests of the NaN guard; never set in real runs."""

    prefix: ClassVar[str] = "debug"
    nan_rank: int = 0
    nan_round: int = 0

    def __post_init__(self) -> None:
        self._non_negative("nan_rank", "nan_round")


@dataclass
class LogConfig(_Section):
    prefix: ClassVar[str] = "log"
    verbosity: int = 1

    def __post_init__(self) -> None:
        self._require(self.verbosity in (0, 1, 2), "verbosity", "must be 0, 1 or 2")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    log: LogConfig = field(default_factory=LogConfig)

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

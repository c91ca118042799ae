"""``keras.Model.fit``'s arguments, translated for a data-parallel job.

Two concerns, kept apart: :func:`fit_overrides` turns the scalar arguments
(``epochs``, ``batch_size``, ``verbose``, ``shuffle``, ``steps_per_epoch``,
``validation_freq``...) into config keys, refusing values a data-parallel
job cannot honour with Keras' wording; :func:`rank_data` turns ``x``, ``y``,
``sample_weight``, ``validation_split`` and ``validation_data`` into the
arrays this rank loads. Other kinds of input plug in at :func:`rank_data`.
Both run on every rank before anything trains, so a refusal fails every rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.errors import ConfigError

if TYPE_CHECKING:
    from mpi_trainer.data.readers import RawArrays

VERBOSITY = {"auto": None, 0: 0, 1: 1, 2: 2}  # Keras' verbose -> log.verbosity (auto: the config's)


@dataclass(frozen=True)
class KerasFitArguments:
    """The arguments of ``keras.Model.fit`` that :func:`mpi_trainer.fit` takes, with Keras' defaults."""

    batch_size: int | None = None
    epochs: int | None = None
    verbose: Any = "auto"
    shuffle: Any = True
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_batch_size: int | None = None
    validation_freq: Any = 1
    validation_split: float = 0.0


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def fit_overrides(args: KerasFitArguments) -> list[tuple[str, Any]]:
    """Config keys for the scalar arguments that were given (``None``/defaults leave the config's value)."""
    pairs: list[tuple[str, Any]] = []
    if args.batch_size is not None:
        _positive_int("batch_size", args.batch_size)
        pairs.append(("train.batch_size", int(args.batch_size)))
    if isinstance(args.initial_epoch, bool) or not isinstance(args.initial_epoch, (int, np.integer)) \
            or args.initial_epoch < 0:
        raise ConfigError(f"`initial_epoch` must be an integer >= 0. Received: initial_epoch={args.initial_epoch!r}")
    if args.epochs is not None:
        _positive_int("epochs", args.epochs)
        if args.epochs <= args.initial_epoch:
            raise ConfigError(f"`epochs` is the index of the last epoch, so it must be greater than "
                              f"`initial_epoch`. Received: epochs={args.epochs}, initial_epoch={args.initial_epoch}")
        pairs.append(("train.epochs", int(args.epochs - args.initial_epoch)))
    if args.verbose not in VERBOSITY:
        raise ConfigError(f"`verbose` must be 'auto', 0, 1 or 2. Received: verbose={args.verbose!r}")
    if VERBOSITY[args.verbose] is not None:
        pairs.append(("log.verbosity", VERBOSITY[args.verbose]))
    if args.shuffle not in (True, False):
        raise ConfigError(f"`shuffle` must be True or False (each worker shuffles its own block; 'batch' "
                          f"applies to HDF5 inputs read in order). Received: shuffle={args.shuffle!r}")
    if args.shuffle is False:
        pairs.append(("train.shuffle", False))
    if args.steps_per_epoch is not None:
        _positive_int("steps_per_epoch", args.steps_per_epoch)
        pairs.append(("train.sync_every", int(args.steps_per_epoch)))
    return pairs + _validation_overrides(args)


def _validation_overrides(args: KerasFitArguments) -> list[tuple[str, Any]]:
    for name in ("validation_steps", "validation_batch_size"):
        if getattr(args, name) is not None:
            _positive_int(name, getattr(args, name))
    if isinstance(args.validation_freq, Sequence):
        raise ConfigError(f"`validation_freq` must be an integer (validate every n rounds); a list of epochs "
                          f"is not supported. Received: validation_freq={args.validation_freq!r}")
    _positive_int("validation_freq", args.validation_freq)
    split = args.validation_split
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 <= split < 1:
        raise ConfigError(f"`validation_split` must be a float in [0, 1). Received: validation_split={split!r}")
    return [("evaluation.every", int(args.validation_freq))] if args.validation_freq != 1 else []


def rank_data(x: Any, y: Any, sample_weight: Any, validation_split: float, validation_data: Any,
              rows_cap: int | None = None, model: Any = None) -> RawArrays | None:
    """This rank's training and validation arrays (a :class:`RawArrays`), or None when it passed none.

    As in ``model.fit``: ``validation_data`` (``(x, y)`` or ``(x, y, None)``) is scored after every
    round as ``val_*``; else ``validation_split`` takes the *last* fraction of ``x``, ``y`` (and
    ``sample_weight``) before any shuffling; else nothing is held out. ``rows_cap`` keeps the first
    rows of the validation data (``validation_steps`` batches). ``y`` per output (a dict keyed by the
    output names of ``model``, or a list in output order) is packed (:mod:`mpi_trainer.data.targets`).
    """
    from mpi_trainer.data.readers import RawArrays

    if x is None and y is None:
        if sample_weight is not None or validation_data is not None:
            raise ConfigError(f"`sample_weight` and `validation_data` go with arrays `x` and `y`. Received: "
                              f"x=None, sample_weight={_kind(sample_weight)}, validation_data={_kind(validation_data)}")
        return None
    x, layout = _features("x", x)
    if y is None:
        raise ConfigError(f"`x` and `y` go together. Received: x={_kind(x)}, y=None")
    y, targets = _targets("y", y, model)
    weights = None if sample_weight is None else _sample_weight(sample_weight, len(x))
    x_val = y_val = None
    if validation_data is not None:
        x_val, y_val = _validation_pair(validation_data, layout, model, targets)
    elif validation_split:
        split_at = int(math.floor(len(x) * (1.0 - validation_split)))
        if split_at in (0, len(x)):
            raise ConfigError(f"Training data contains {len(x)} samples, which is not sufficient to split it "
                              f"into a validation and training set. Received: validation_split={validation_split}")
        x, x_val, y, y_val = x[:split_at], x[split_at:], y[:split_at], y[split_at:]
        weights = None if weights is None else weights[:split_at]
    if x_val is not None and y_val is not None and rows_cap is not None:
        x_val, y_val = x_val[:rows_cap], y_val[:rows_cap]
    return RawArrays(x, y, x_val=x_val, y_val=y_val, sample_weight=weights, input_layout=layout,
                     target_layout=targets)


def _features(name: str, value: Any) -> tuple[np.ndarray, list[Any] | None]:
    """Features as one array, and (dict inputs of a multi-input model) where each input's columns are."""
    if not isinstance(value, Mapping):
        return _array(name, value), None
    from mpi_trainer.models.packed import pack

    return pack(value, name)


def _targets(name: str, y: Any, model: Any) -> tuple[np.ndarray, list[Any] | None]:
    """Labels as one array, and (``y`` per output of a multi-output model) where each output's columns are."""
    from mpi_trainer.data.targets import by_output, describe, is_structure, output_names, pack_targets

    if not is_structure(y):
        return _array(name, y), None
    names = output_names(model)
    if names is None:
        raise ConfigError(f"`{name}` per output needs `model` as a keras.Model whose outputs carry those names. "
                          f"Received: {name}={describe(y)} with model of type {type(model).__name__}; expected "
                          f"model as a keras.Model (built, compiled) or {name} as one array")
    if len(names) == 1:  # one output: its targets as they are
        return _array(name, by_output(y, names, name)[names[0]]), None
    return pack_targets(y, names, name)


def _validation_pair(validation_data: Any, layout: list[Any] | None, model: Any = None,
                     targets: list[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise ConfigError(f"`validation_data` must be a tuple (x_val, y_val) or (x_val, y_val, "
                          f"val_sample_weight). Received: validation_data={_kind(validation_data)}")
    if len(validation_data) == 3 and validation_data[2] is not None:
        raise ConfigError("`validation_data` with sample weights is not supported: the validation loss is "
                          "unweighted. Received: validation_data=(x_val, y_val, val_sample_weight); expected "
                          "(x_val, y_val) or (x_val, y_val, None)")
    x_val, val_layout = _features("validation_data[0]", validation_data[0])
    if val_layout != layout:
        raise ConfigError(f"`validation_data[0]` must hold the same inputs, of the same shapes, as `x`. Received: "
                          f"{_layout_text(val_layout)}; expected {_layout_text(layout)}")
    y_val, val_targets = _targets("validation_data[1]", validation_data[1], model)
    if val_targets != targets:
        raise ConfigError(f"`validation_data[1]` must hold the same outputs, of the same shapes and dtypes, as "
                          f"`y`. Received: {_layout_text(val_targets)}; expected {_layout_text(targets)}")
    return x_val, y_val


def _layout_text(layout: list[Any] | None) -> str:
    if layout is None:
        return "one array"
    return str({c.name: (c.shape, c.dtype) if hasattr(c, "dtype") else c.shape for c in layout})


def _sample_weight(sample_weight: Any, rows: int) -> np.ndarray:
    from mpi_trainer.data.targets import describe, is_structure

    if is_structure(sample_weight):
        raise ConfigError(f"`sample_weight` per output (a dict or list) is not supported: pass one array, which "
                          f"weights every output's loss, as Keras does with one array. Received: "
                          f"sample_weight={describe(sample_weight)}; expected a 1-D array, one weight per row of `x`")
    weights = _array("sample_weight", sample_weight)
    if weights.ndim != 1 or len(weights) != rows or not np.issubdtype(weights.dtype, np.number):
        raise ConfigError(f"`sample_weight` must be a 1-D array of numbers, one per row of `x`. Received: "
                          f"sample_weight={_kind(weights)} for {rows} rows")
    if not np.all(np.isfinite(weights)) or weights.min() < 0:
        raise ConfigError("`sample_weight` must hold finite numbers >= 0. Received: a negative or non-finite weight")
    return weights.astype(np.float32)


def _array(name: str, value: Any) -> np.ndarray:
    """A NumPy array from an array-like; structures (dicts, lists of arrays) are refused by name."""
    if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and value and hasattr(value[0], "shape")):
        keys = sorted(value) if isinstance(value, Mapping) else f"{len(value)} arrays"
        raise ConfigError(f"`{name}` as a {type(value).__name__} of arrays is not supported (a multi-input model "
                          f"takes `x` as a dict keyed by its input names, a multi-output model `y` as a dict keyed "
                          f"by its output names): pass one array. Received: {name}={type(value).__name__} with {keys}")
    if not hasattr(value, "__len__") and not hasattr(value, "__array__"):
        raise ConfigError(f"`{name}` must be a NumPy array (or array-like). Received: {name}={_kind(value)}")
    return np.asarray(value)


def _kind(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} of shape {getattr(value, 'shape', '?')}"


def user_sets(key: str, config: Any, overrides: Any) -> bool:
    """Whether the config (a dict or a TOML path) or the overrides set the dotted ``key``."""
    import tomllib

    pairs = overrides.items() if isinstance(overrides, Mapping) else [
        tuple(item.split("=", 1)) if isinstance(item, str) else item for item in (overrides or [])]
    if any(str(pair[0]).strip() == key for pair in pairs):
        return True
    if config is None:
        return False
    try:
        tree = config if isinstance(config, Mapping) else tomllib.loads(open(config, encoding="utf-8").read())
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the config loader reports that file itself
    section, _, name = key.partition(".")
    return isinstance(tree.get(section), Mapping) and name in tree[section]

"""``keras.Model.fit``'s scalar arguments as config keys, for ``fit(build_fn | zoo name)`` without ``x``
(the config's ``data.source`` is the data): :func:`fit_overrides` turns ``epochs``, ``batch_size``,
``verbose``, ``shuffle`` and ``validation_freq`` into config keys, refusing values Keras refuses, with
Keras' wording. It runs on every rank before anything trains, so a refusal fails every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.errors import ConfigError

if TYPE_CHECKING:
    pass

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

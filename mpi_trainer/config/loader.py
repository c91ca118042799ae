"""Loading a config: defaults < TOML file < ``--set`` overrides, with unknown keys refused."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from mpi_trainer import hooks
from mpi_trainer.config.rules import check_config, with_derived_values
from mpi_trainer.config.schema import Config, keyed_fields, reject
from mpi_trainer.errors import ConfigError

SectionT = TypeVar("SectionT")


def _is_section(hint: object) -> typing.TypeGuard[type]:
    """A field whose type is a dataclass: a section (or table) of its own, not a key."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key the configuration accepts, e.g. ``train.epochs``."""
    hints = typing.get_type_hints(cls)
    keys = []
    for item in keyed_fields(cls):
        dotted, hint = f"{prefix}{item.name}", hints[item.name]
        if _is_section(hint):
            keys.extend(all_keys(hint, dotted + "."))
        else:
            keys.append(dotted)
    return keys


def _unknown_key(dotted: str) -> ConfigError:
    known = all_keys()
    close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return ConfigError(f"Unknown config key `{dotted}`.{hint} Known keys: {', '.join(known)}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # e.g. bool | Literal["auto"]
        for member in typing.get_args(hint):
            literal = typing.get_origin(member) is typing.Literal
            if (value in typing.get_args(member)) if literal else _accepts(value, member):
                return value
        reject(key, value, f"must be one of {' or '.join(_hint_name(m) for m in typing.get_args(hint))}")
    if typing.get_origin(hint) is typing.Literal:
        hint = str  # a choice: its section names the choices when the value is not one of them
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
        reject(key, value, f"must be of type {getattr(hint, '__name__', str(hint))}")
    return value


def _accepts(value: Any, hint: Any) -> bool:
    return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))


def _hint_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def _build(cls: type[SectionT], table: object, prefix: str) -> SectionT:
    if not isinstance(table, dict):
        reject(prefix.rstrip("."), table, "must be a table of keys")
    keyed = {item.name for item in keyed_fields(cls)}
    hints = {k: v for k, v in typing.get_type_hints(cls).items() if k != "prefix" and k in keyed}
    for name in table:
        if name not in hints:
            raise _unknown_key(f"{prefix}{name}")
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        hint = hints[name]
        if _is_section(hint):
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


def load_config(source: str | Path | dict[str, Any] | None = None,
                overrides: list[Any] | dict[str, Any] | None = None) -> Config:
    """Read ``source`` (a TOML path, or a dict of sections), apply overrides and validate.

    ``overrides``: ``"KEY=VALUE"`` strings (as ``--set`` takes them), ``(key, value)`` pairs,
    or a dict of dotted keys to values; later ones win.
    """
    table = copy.deepcopy(source) if isinstance(source, dict) else read_toml(source) if source is not None else {}
    pairs = overrides.items() if isinstance(overrides, dict) else overrides or []
    for item in pairs:
        _apply_override(table, *(parse_override(item) if isinstance(item, str) else item))
    return config_from_dict(table)


def config_from_dict(table: dict[str, Any]) -> Config:
    """Build every section (each checks its own keys), apply the rules across sections once, and
    fill in the derived values: the config every rank then holds unchanged.

    The test hooks' section is no section of the config: it is taken off the table first, checked against
    the config, and kept as the config's ``test_hooks`` (all off where the table has none).
    """
    if not isinstance(table, dict):
        reject("config", table, "must be a table of sections")
    table = dict(table)
    test_hooks = hooks.take_from(table)
    cfg = _build(Config, table, "")
    check_config(cfg)
    hooks.check_with(cfg, test_hooks)
    return with_derived_values(dataclasses.replace(cfg, test_hooks=test_hooks))

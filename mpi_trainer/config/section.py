"""What every config section shares: its dotted key prefix and the Keras-style checks of its own keys."""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from mpi_trainer.errors import ConfigError


def reject(key: str, value: Any, expected: str) -> NoReturn:
    """Raise the Keras-style error for one key: what is expected, then the value received."""
    raise ConfigError(f"`{key}` {expected}. Received: {key}={value!r}")


class Section:
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

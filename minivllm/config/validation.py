"""Small checks that raise ValueError naming the key and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


def check_choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{key}={value!r}: must be one of {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class Range:
    """The numbers from ``low`` to ``high`` (None: unbounded on that side), each end included
    unless it is open. A table of these is what both the engine's checks and the server's
    schema read (``sampling_params.RANGES``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    said: str | None = None
    """How a message words what is allowed, where the interval alone would mislead (e.g. ``top_k``)."""

    def __str__(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low}"
        hi = "inf" if self.high is None else f"{self.high}"
        opening = "(" if self.low_open or self.low is None else "["
        closing = ")" if self.high_open or self.high is None else "]"
        return f"{opening}{lo}, {hi}{closing}"

    def allows(self, value: float) -> bool:
        """NaN is in no range: every comparison with it is false, so it would pass the bounds."""
        if value != value:
            return False
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return not (too_low or too_high)

    def message(self, key: str, value: Any) -> str:
        return f"{key}={value!r}: must be {self.said or f'in {self}'}"

    def check(self, key: str, value: float) -> None:
        """Raise unless ``value`` is a number in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}={value!r}: must be a number")
        if not self.allows(value):
            raise ValueError(self.message(key, value))


def check_range(
    key: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise unless ``low <= value <= high`` (or ``<`` where the bound is open)."""
    Range(low, high, low_open, high_open).check(key, value)

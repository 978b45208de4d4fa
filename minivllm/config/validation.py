"""Small checks that raise ValueError naming the key and what is allowed."""

from __future__ import annotations

from typing import Any, Iterable


def check_choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{key}={value!r}: must be one of {', '.join(map(str, allowed))}")


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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}={value!r}: must be a number")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
        raise ValueError(f"{key}={value!r}: must be in {interval}")

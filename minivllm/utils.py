"""Small helpers shared across components."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate


def instantiate_target(node: Any, **runtime_kwargs: Any) -> Any:
    """Instantiate a ``_target_`` node, adding arguments only known at run time.

    The node's own keys become keyword arguments too, so a user's class can take
    options from the config (``parallel.worker.my_option=3``).
    """
    factory = instantiate(node, _partial_=True)
    return factory(**runtime_kwargs)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)

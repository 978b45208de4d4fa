"""Small helpers shared across components."""

from __future__ import annotations

import os
from pathlib import Path
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


def cache_dir(*parts: str) -> Path:
    """minivllm's folder for what it builds once per machine (compiled CPU kernels, inductor's
    cache): ``$MINIVLLM_CACHE_DIR``, else ``$XDG_CACHE_HOME/minivllm``, else ``~/.cache/minivllm``."""
    root = os.environ.get("MINIVLLM_CACHE_DIR")
    if not root:
        root = os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "minivllm"
        )
    return Path(root, *parts)

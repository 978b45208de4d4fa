"""The names a model answers to (``serve.served_model_name``), as vLLM's
``--served-model-name``: one name, or several (a list, or comma-separated); the
first is the id responses report, all are accepted in requests. Left unset, the
name is ``model.path``, except for the bundled demo model: ``demo``, the name of
its preset (``model=demo``), not the absolute path of the package's asset folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_NAME = "demo"
DEMO_PATH = Path(__file__).resolve().parents[1] / "assets" / "demo-llama"


def check_served_model_name(value: Any) -> None:
    """None, a name, or a non-empty list of names; a ValueError naming the key otherwise."""
    if value is None:
        return
    names = _split(value)
    if names is None or not names or not all(names):
        raise ValueError(
            f"serve.served_model_name={value!r}: must be a name, a comma-separated string of names, "
            "or a list of names (e.g. serve.served_model_name=[a,b]); names may not be empty"
        )


def served_model_names(served_model_name: Any, model_path: str) -> list[str]:
    """Every name the model answers to; the first is the one reported."""
    if served_model_name is not None:
        return _split(served_model_name)
    return [DEMO_NAME if _is_demo(model_path) else model_path]


def _split(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        names = [str(n) if isinstance(n, str) else None for n in value]
        return None if None in names or any("," in n for n in names) else names
    return None


def _is_demo(model_path: str) -> bool:
    try:
        return Path(model_path).resolve() == DEMO_PATH
    except (OSError, ValueError):
        return False

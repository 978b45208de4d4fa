"""Model presets: the options of the ``model`` group (``conf/model/NAME.yaml``).

``model=NAME`` picks a preset, as any Hydra group choice does; a checkpoint (a
directory, a ``.gguf`` file or a hub id) goes in the key ``model.path``. vLLM users
type ``--model PATH``, so ``model=PATH`` is the first thing they try: Hydra would
answer with a missing ``model//PATH`` config, so it is caught first and answered
with the override that works. ``LLM(model=...)`` takes either, see ``llm_kwargs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

PRESETS_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"


def model_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def is_preset(name: str) -> bool:
    return "/" not in name and (PRESETS_DIR / f"{name}.yaml").is_file()


def check_model_choice(overrides: Sequence[str]) -> None:
    """Raise ValueError for ``model=X`` when X is a path or hub id (it holds a ``/`` or
    ends in ``.gguf``) and no preset. A bare unknown name is left to Hydra, whose error
    lists the presets, and so is a sweep (``model=a,b``, ``model=choice(...)``)."""
    for override in overrides:
        key, sep, value = override.partition("=")
        if key.lstrip("+") != "model" or not sep or "," in value or "(" in value:
            continue
        if ("/" in value or value.endswith(".gguf")) and not is_preset(value):
            raise ValueError(
                f"model={value}: not a model preset ({', '.join(model_presets())}); "
                f"a checkpoint directory, .gguf file or hub id goes in model.path: model.path={value}"
            )

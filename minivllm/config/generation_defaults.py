"""Default SamplingParams from a checkpoint's ``generation_config.json`` (vLLM's ``generation_config``).

With ``model.generation_config=auto`` the sampling fields the checkpoint's
generation config sets away from transformers' defaults become the defaults of
``LLM.generate`` / ``LLM.chat`` when no SamplingParams is given (as vLLM does);
``vllm`` turns this off; any other value is a folder holding a
``generation_config.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from minivllm.config.vllm_config import VllmConfig

logger = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field
_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(cfg: VllmConfig) -> dict[str, Any]:
    """SamplingParams keywords from the generation config ({} when off or absent)."""
    source = cfg.model.generation_config
    if source == "vllm":
        return {}
    folder = cfg.checkpoint_dir if source == "auto" else Path(source).expanduser()
    if folder is None or not (Path(folder) / "generation_config.json").is_file():
        if source != "auto":
            raise ValueError(f"model.generation_config={source!r}: no generation_config.json in that folder")
        return {}
    diff = GenerationConfig.from_pretrained(str(folder), local_files_only=True).to_diff_dict()
    defaults = {field: diff[key] for key, field in _FIELDS.items() if diff.get(key) is not None}
    if defaults:
        logger.info("Default sampling parameters from %s/generation_config.json: %s", folder, defaults)
    return defaults

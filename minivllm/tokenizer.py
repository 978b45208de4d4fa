"""Loading the tokenizer, offline (vLLM's ``get_tokenizer``).

A module of its own at the bottom of the package graph: the engine's front end,
the structured-output backend (a layer below the engine) and the benchmarks all
load the tokenizer through it, and tests use its bundled ``DEMO_TOKENIZER``;
``config/`` describes and builds nothing, so it cannot live there.
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minivllm.config.load import find_gguf_file, find_local_checkpoint
from minivllm.config.vllm_config import VllmConfig

logger = logging.getLogger(__name__)
DEMO_TOKENIZER = Path(__file__).resolve().parent / "assets" / "demo-llama"


def get_tokenizer(cfg: VllmConfig) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; for a dummy-weights preset with no local files,
    the bundled demo tokenizer stands in (its ids are valid in any larger vocab). A GGUF
    file carries its own vocabulary, which transformers turns into a tokenizer."""
    if cfg.load.format == "gguf" and not cfg.model.tokenizer:
        gguf_file = find_gguf_file(cfg.model.path)
        return AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True)
    hub = cfg.hub_options(tokenizer=True)
    given = Path(cfg.tokenizer_path)
    source = given if given.is_dir() else find_local_checkpoint(cfg.tokenizer_path, hub)
    if source is None and cfg.load.format == "dummy":
        logger.warning(
            "No local tokenizer for %r; using the bundled demo tokenizer with random weights.", cfg.tokenizer_path
        )
        source = DEMO_TOKENIZER
    if source is None:
        raise ValueError(f"model.tokenizer={cfg.tokenizer_path!r}: no local tokenizer files found")
    return AutoTokenizer.from_pretrained(str(source), local_files_only=True, trust_remote_code=hub.trust_remote_code)

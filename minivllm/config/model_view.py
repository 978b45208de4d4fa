"""``llm.llm_engine.model_config`` with vLLM's names, read from the validated config.

Scripts and harnesses written for vLLM read the engine's model settings there
(``llm.llm_engine.model_config.max_model_len`` is the usual one). Our tree keeps them
in ``VllmConfig`` (``cfg.model`` holds what was asked, ``cfg.max_model_len`` and
``cfg.dtype`` what was resolved from the checkpoint); this view hands over the
resolved values under vLLM's attribute names. It is read-only and holds only what
minivllm has: an attribute vLLM has and this view lacks is an AttributeError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig


@dataclass(frozen=True)
class ModelConfigView:
    model: str
    """The checkpoint: a directory, a .gguf file or a hub id (``model.path``)."""
    tokenizer: str
    """Where the tokenizer is loaded from (``model.tokenizer``, else the checkpoint)."""
    max_model_len: int
    """Longest prompt + output, resolved from the checkpoint when not set."""
    dtype: torch.dtype
    """The weights' and activations' dtype, resolved (``auto``: the checkpoint's, bf16/fp32 by device)."""
    seed: int
    max_logprobs: int
    trust_remote_code: bool
    runner_type: str
    """``generate`` or ``pooling`` (vLLM's ``runner``)."""
    hf_config: Any
    """The checkpoint's transformers config."""
    hf_text_config: Any
    """The language model's config (``text_config`` of a multimodal checkpoint)."""

    @classmethod
    def of(cls, cfg: VllmConfig) -> ModelConfigView:
        return cls(
            model=cfg.model.path,
            tokenizer=cfg.tokenizer_path,
            max_model_len=cfg.max_model_len,
            dtype=cfg.dtype,
            seed=cfg.model.seed,
            max_logprobs=cfg.model.max_logprobs,
            trust_remote_code=cfg.model.trust_remote_code,
            runner_type=cfg.model.runner,
            hf_config=cfg.hf_config,
            hf_text_config=cfg.hf_text_config,
        )

    def get_vocab_size(self) -> int:
        return self.hf_text_config.vocab_size

    def get_hidden_size(self) -> int:
        return self.hf_text_config.hidden_size

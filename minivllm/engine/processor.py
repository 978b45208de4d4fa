"""Checks and tokenizes a request before it reaches the engine core.

Every rule here raises ValueError naming the problem, so a bad request fails
before any work starts and the engine keeps serving the others.
"""
from __future__ import annotations

from typing import Any, Union

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import VllmConfig
from minivllm.sampling_params import SamplingParams

PromptType = Union[str, dict[str, Any], list[int]]
"""A string, ``{"prompt": str}``, ``{"prompt_token_ids": [...]}`` or a list of token ids."""


class Processor:
    def __init__(self, cfg: VllmConfig, tokenizer: PreTrainedTokenizerBase, max_tokens_in_cache: int) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.max_tokens_in_cache = max_tokens_in_cache
        self.vocab_size = cfg.hf_config.vocab_size

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
        elif isinstance(prompt, dict) and "prompt" in prompt:
            return self.tokenize(prompt["prompt"])
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            text, ids = None, list(prompt)
        else:
            raise ValueError(
                f"prompt: expected a string, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids'; "
                f"got {type(prompt).__name__}"
            )
        self._check_ids(ids)
        return text, ids

    def _check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt: is empty; give at least one token")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.cfg.max_model_len:
            raise ValueError(
                f"prompt: {len(ids)} tokens leave no room to generate within max_model_len={self.cfg.max_model_len}; "
                f"shorten it or raise model.max_model_len"
            )

    def max_output_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        room = self.cfg.max_model_len - num_prompt_tokens
        limit = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.logprobs is not None and params.logprobs > self.cfg.model.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs}: at most model.max_logprobs={self.cfg.model.max_logprobs}")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.cfg.model.max_logprobs:
            raise ValueError(
                f"prompt_logprobs={params.prompt_logprobs}: at most model.max_logprobs={self.cfg.model.max_logprobs}"
            )
        bad_stop = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad_stop:
            raise ValueError(f"stop_token_ids: {bad_stop} outside the vocabulary [0, {self.vocab_size})")
        if num_prompt_tokens + limit > self.max_tokens_in_cache:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({limit}) can never fit the KV cache "
                f"({self.max_tokens_in_cache} tokens); lower max_tokens or give the cache more memory"
            )
        return limit

"""Checks and tokenizes a request before it reaches the engine core.

Every rule here raises ValueError naming the problem, so a bad request fails
before any work starts and the engine keeps serving the others.
"""
from __future__ import annotations

from typing import Any, Union

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import VllmConfig
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.lora.checker import LoRAChecker
from minivllm.sample.custom_processors import check_picklable
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend import check_grammar

PromptType = Union[str, dict[str, Any], list[int]]
"""A string, ``{"prompt": str}``, ``{"prompt_token_ids": [...]}`` or a list of token ids."""
PROMPT_KEYS = ("prompt", "prompt_token_ids")
"""The keys of a prompt dict the engine handles; any other (e.g. ``multi_modal_data``) is refused."""


class Processor:
    def __init__(self, cfg: VllmConfig, tokenizer: PreTrainedTokenizerBase, kv_spec: KVCacheSpec) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.kv_spec = kv_spec
        """The engine's KV cache (the smallest replica's with data parallelism): what a request must fit."""
        self.max_tokens_in_cache = kv_spec.num_tokens
        self.vocab_size = cfg.hf_config.vocab_size
        self.lora = LoRAChecker(cfg.lora, cfg.hf_config)
        """``self.lora.check(lora_request)`` validates a request's adapter."""

    def tokenize(self, prompt: PromptType, truncate_prompt_tokens: int | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids); ``truncate_prompt_tokens`` keeps only the last k ids (before the checks)."""
        text, ids = self._split(prompt)
        if truncate_prompt_tokens is not None:
            ids = ids[-truncate_prompt_tokens:]
        self._check_ids(ids)
        return text, ids

    def _split(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict) and (unknown := sorted(set(prompt) - set(PROMPT_KEYS))):
            raise ValueError(
                f"prompt: key(s) {', '.join(map(repr, unknown))} not supported by this engine; "
                f"a prompt dict may hold {' and '.join(PROMPT_KEYS)}"
            )
        if isinstance(prompt, str):
            text, ids = prompt, self._encode(prompt) if prompt else []
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
        elif isinstance(prompt, dict) and "prompt" in prompt:
            return self._split(prompt["prompt"])
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            text, ids = None, list(prompt)
        else:
            raise ValueError(
                f"prompt: expected a string, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids'; "
                f"got {type(prompt).__name__}"
            )
        return text, ids

    def _encode(self, text: str) -> list[int]:
        """Token ids; transformers' too-long warning is off (``_check_ids`` says it better)."""
        return self.tokenizer.encode(text, add_special_tokens=True, verbose=False)

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
        self.check_params(params)
        # A sliding-window model holds only its window's blocks (plus one step's) at once.
        step_tokens = self.cfg.scheduler.max_num_batched_tokens
        held = self.kv_spec.max_blocks_per_request(num_prompt_tokens + limit, step_tokens) * self.kv_spec.block_size
        if held > self.max_tokens_in_cache:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({limit}) can never fit the KV cache "
                f"({self.max_tokens_in_cache} tokens); lower max_tokens or give the cache more memory"
            )
        return limit

    def check_params(self, params: SamplingParams) -> None:
        """The SamplingParams checks that need the model: logprob caps and token ids."""
        max_n = self.cfg.serve.max_n
        if params.n > max_n:
            raise ValueError(f"n={params.n}: must be in [1, {max_n}] (serve.max_n={max_n})")
        cap = self.cfg.model.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is None or cap == -1:
                continue
            if value == -1 or value > cap:
                hint = "; -1 (the whole vocabulary) needs model.max_logprobs=-1" if value == -1 else ""
                raise ValueError(f"{name}={value}: must be in [0, {cap}] (model.max_logprobs={cap}){hint}")
        id_lists = {
            "stop_token_ids": params.stop_token_ids,
            "allowed_token_ids": params.allowed_token_ids or [],
            "logit_bias": list(params.logit_bias or {}),
        }
        for name, ids in id_lists.items():
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise ValueError(f"{name}: token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        self._bad_words_token_ids(params.bad_words or [])
        if self.cfg.world_size > 1:  # the workers are other processes
            check_picklable(params)
        if params.structured_outputs is not None:
            check_grammar(params.structured_outputs)

    def prepare_params(self, params: SamplingParams, eos_token_id: int | None) -> SamplingParams:
        """A copy of ``params`` with the token ids the workers need filled in."""
        params = params.clone()
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(params, name) == -1:
                setattr(params, name, self.vocab_size)
        stop_ids = set(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(eos_token_id)
        params._all_stop_token_ids = stop_ids
        params._bad_words_token_ids = self._bad_words_token_ids(params.bad_words or [])
        return params

    def _bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """Each word as token ids, alone and after a space. The spaced form is kept only
        when the space merges into the first token (same length, different first id),
        so a word is also banned mid-sentence without banning bare spaces."""
        sequences: list[list[int]] = []
        for word in words:
            bare = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            forms = [bare, spaced] if len(spaced) == len(bare) and spaced[:1] != bare[:1] else [bare]
            for ids in forms:
                if ids and ids not in sequences:
                    sequences.append(ids)
        too_big = [t for ids in sequences for t in ids if t >= self.vocab_size]
        if too_big:
            raise ValueError(f"bad_words: tokenize to ids {too_big[:5]} outside the vocabulary [0, {self.vocab_size})")
        return sequences

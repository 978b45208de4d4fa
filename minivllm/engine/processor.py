"""Checks and tokenizes a request before it reaches the engine core.

``Processor.process`` is the one admission path (vLLM's ``InputProcessor.process_inputs``):
``LLMEngine`` runs it for offline requests, the front ends of engine processes
(``AsyncLLM``, ``DataParallelEngine``, through ``EngineCoreClient``) run it before
they send a request, and the engine process then queues the ``ProcessedRequest``
as it is. Every rule raises ValueError naming the problem, so a bad request
fails before any work starts and the engine keeps serving the others.

The rules live beside it, and this module runs them in order (options, adapter,
prompt, context, params, KV cache): ``prompt_tokens.py`` splits and tokenizes a
prompt (once) and checks its ids, ``prompt_images.py`` runs a prompt's images
through the model's processor, ``request_checks.py`` holds the checks that need
the config or the model and prepares the params the workers get.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import VllmConfig
from minivllm.context_length import check_pooling_fits, check_prompt_fits
from minivllm.engine.prompt_images import tokenize_with_images
from minivllm.engine.prompt_tokens import PROMPT_KEYS, PromptTokenizer, PromptType
from minivllm.engine.request_checks import (
    check_fits_kv_cache,
    check_params,
    check_priority_and_salt,
    prepare_params,
)
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.lora.peft_loader import LoRAChecker
from minivllm.lora_request import LoRARequest
from minivllm.models.interfaces import supports_multimodal
from minivllm.models.registry import ModelRegistry
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.multimodal.processing import MultiModalProcessor, load_multimodal_processor
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import SamplingParams

__all__ = ["PROMPT_KEYS", "ProcessedRequest", "Processor", "PromptType"]


@dataclass
class ProcessedRequest:
    """A request that passed every check, tokenized once (vLLM's ``EngineCoreRequest``).

    ``LLMEngine.add_processed`` queues it without tokenizing or checking it again;
    front ends pickle it to their engine processes.
    """

    request_id: str
    prompt: str | None
    """The prompt's text, when it was given as text (None for token ids only)."""
    prompt_token_ids: list[int]
    """After ``truncate_prompt_tokens``; never empty, inside the vocabulary, shorter than max_model_len
    (pooling: no longer than it)."""
    params: SamplingParams
    """The processor's own copy, prepared for the workers (stop and bad-word token ids filled in);
    a front end may still change its ``output_kind``. A pooling request's is one greedy step."""
    max_tokens: int
    """Tokens it may generate: ``params.max_tokens`` capped by the room left in max_model_len (1 for pooling)."""
    group_id: str
    """The client request it is part of (the scheduler takes turns between groups); default its own id."""
    priority: int = 0
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None
    pooling_params: PoolingParams | None = None
    """Set for a pooling request (model.runner=pooling): it returns the prompt's pooled vector."""
    eos_token_id: int | None = None
    """The token that ends generation (None for pooling requests)."""
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    """The prompt's images, processed; their placeholders are expanded in ``prompt_token_ids``."""


class Processor:
    engine_in_other_process = False
    """Set by a front end whose engines run in other processes (``EngineCoreClient``): every
    request is pickled to them, so its params must pickle even with one rank."""

    def __init__(self, cfg: VllmConfig, tokenizer: PreTrainedTokenizerBase, kv_spec: KVCacheSpec) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.kv_spec = kv_spec
        """The engine's KV cache (the smallest replica's with data parallelism): what a request must fit."""
        self.kv_capacity_tokens = kv_spec.num_tokens
        self._ids = itertools.count()
        """The ids ``process`` gives requests that come without one (0, 1, ...)."""
        self.vocab_size = cfg.hf_text_config.vocab_size
        self.prompts = PromptTokenizer(tokenizer, self.vocab_size)
        """Splits, tokenizes and checks prompts (``prompt_tokens.py``)."""
        self.lora = LoRAChecker(cfg.lora, cfg.hf_config)
        """``self.lora.check(lora_request)`` validates a request's adapter."""
        self.mm: MultiModalProcessor | None = None
        """The checkpoint's image processor and the per-prompt limits; None for a text-only model."""
        if cfg.is_multimodal:  # the front end imports a model class only for these
            model_cls = ModelRegistry.resolve(cfg.architecture)
            if supports_multimodal(model_cls):
                self.mm = load_multimodal_processor(cfg, model_cls.image_token_id(cfg.hf_config))

    @property
    def eos_token_id(self) -> int | None:
        """The model config's EOS (its first, when it names several), else the tokenizer's."""
        eos = getattr(self.cfg.hf_config, "eos_token_id", None) or getattr(
            self.cfg.hf_text_config, "eos_token_id", None
        )
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return self.tokenizer.eos_token_id if eos is None else eos

    def process(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | PoolingParams | None = None,
        *,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        group_id: str | None = None,
    ) -> ProcessedRequest:
        """Check and tokenize one request: the prompt (tokenized once, ``truncate_prompt_tokens``
        applied), its SamplingParams (None: the defaults) or PoolingParams, adapter, priority and
        cache salt. ``request_id`` None: a new id of this processor's (its engine's). Raises
        ValueError naming the field; nothing is queued anywhere."""
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if isinstance(params, PoolingParams):
            return self._process_pooling(request_id, prompt, params, lora_request, priority, cache_salt, group_id)
        if self.cfg.model.runner == "pooling":
            raise ValueError("params: this engine pools (model.runner=pooling); generating needs runner=generate")
        params = SamplingParams() if params is None else params
        check_priority_and_salt(self.cfg, priority, cache_salt)
        self.lora.check(lora_request)
        text, ids, mm_features = tokenize_with_images(
            self.prompts, self.mm, self.cfg.architecture, prompt, params.truncate_prompt_tokens
        )
        check_prompt_fits(len(ids), params.max_tokens, self.cfg.max_model_len)
        max_tokens = self.max_output_tokens(len(ids), params)
        eos = self.eos_token_id
        return ProcessedRequest(
            str(request_id),
            text,
            ids,
            self.prepare_params(params, eos),
            max_tokens,
            group_id or str(request_id),
            priority,
            cache_salt,
            lora_request,
            eos_token_id=eos,
            mm_features=mm_features,
        )

    def _process_pooling(
        self,
        request_id: str,
        prompt: PromptType,
        params: PoolingParams,
        lora_request: LoRARequest | None,
        priority: int,
        cache_salt: str | None,
        group_id: str | None,
    ) -> ProcessedRequest:
        """One step that computes the prompt and returns its pooled vector (model.runner=pooling)."""
        if lora_request is not None:
            raise ValueError("lora_request: pooling runs the base model; leave it None with pooling_params")
        if self.cfg.model.runner != "pooling":
            raise ValueError("pooling_params: this engine generates; pooling needs model.runner=pooling")
        check_priority_and_salt(self.cfg, priority, cache_salt)
        params.check(self.cfg.hf_config, self.cfg.hf_config.hidden_size)
        text, ids = self.tokenize(prompt, params.truncate_prompt_tokens)
        check_pooling_fits(len(ids), self.cfg.max_model_len)
        one_step = self.prepare_params(SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), None)
        return ProcessedRequest(
            str(request_id),
            text,
            ids,
            one_step,
            1,
            group_id or str(request_id),
            priority,
            cache_salt,
            pooling_params=params,
        )

    def tokenize(self, prompt: PromptType, truncate_prompt_tokens: int | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids); ``truncate_prompt_tokens`` keeps only the last k ids (before the checks)."""
        return self.prompts.tokenize(prompt, truncate_prompt_tokens)

    def max_output_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """``params.max_tokens`` capped by the room left in max_model_len, after checking ``params``
        and that the request can ever fit the KV cache."""
        room = self.cfg.max_model_len - num_prompt_tokens
        limit = room if params.max_tokens is None else min(params.max_tokens, room)
        self.check_params(params)
        step_tokens = self.cfg.scheduler.max_num_batched_tokens
        check_fits_kv_cache(self.kv_spec, self.kv_capacity_tokens, step_tokens, num_prompt_tokens, limit)
        return limit

    def check_params(self, params: SamplingParams) -> None:
        """The SamplingParams checks that need the model (``request_checks.check_params``)."""
        crosses_processes = self.cfg.world_size > 1 or self.engine_in_other_process
        check_params(self.cfg, self.vocab_size, params, crosses_processes)

    def prepare_params(self, params: SamplingParams, eos_token_id: int | None) -> SamplingParams:
        """A copy of ``params`` with the token ids the workers need filled in (stop ids, bad words)."""
        return prepare_params(params, eos_token_id, self.tokenizer, self.vocab_size)

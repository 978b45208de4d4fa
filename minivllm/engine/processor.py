"""Admission: check and tokenize a request before it reaches the engine core.

``Processor.process`` is the one admission path (vLLM's ``InputProcessor.process_inputs``):
``LLMEngine`` runs it for offline requests, the front ends of engine processes
(``AsyncLLM``, ``DataParallelEngine``, through ``EngineCoreClient``) run it before
they send a request, and the engine process then queues the ``ProcessedRequest``
as it is. Every rule raises ValueError naming the problem, so a bad request
fails before any work starts and the engine keeps serving the others. The rules
run in order: options (priority, cache salt), adapter, prompt, context, params,
KV cache.

**Prompts.** A prompt is a string, a list of token ids, or a dict with ``prompt``
(text) and/or ``prompt_token_ids`` (given ids win over the text, which is then
only reported back). A text prompt is tokenized here, once, with the tokenizer's
special tokens. Every id list that leaves the processor is non-empty and inside
``[0, vocab_size)``; ``truncate_prompt_tokens`` is applied before that check. As in
vLLM, emptiness is a property of the token ids, not of the text: ``""`` is served
when the tokenizer adds a BOS token (it tokenizes to ``[bos]``), and refused when
its tokenization is empty, as ``prompt_token_ids=[]`` is.

**Images.** A prompt with ``multi_modal_data`` is split into text and ids as any
other, then the model's processor expands each image placeholder into the
image's tokens and returns one ``MultiModalFeature`` per image (what the
scheduler and the encoder cache run). A text-only model refuses images; a prompt
that holds placeholder tokens must bring its images; ``truncate_prompt_tokens``
cannot be combined with images (it could cut one in half).

**Params.** ``SamplingParams`` checks its own fields when it is built; what it
cannot know is checked here: ``n`` against ``serve.max_n``, logprobs against
``model.max_logprobs``, token ids against the vocabulary, whether the request can
ever fit the KV cache, priority against the scheduler's policy, and that params
pickle when they travel to other processes. ``prepare_params`` never changes the
caller's params: the workers get a copy with the stop and bad-word token ids
filled in.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import VllmConfig
from minivllm.context_length import check_pooling_fits, check_prompt_fits
from minivllm.inputs import PromptType
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.lora.peft_loader import LoRAChecker
from minivllm.lora_request import LoRARequest
from minivllm.models.interfaces import supports_multimodal
from minivllm.models.registry import ModelRegistry
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.multimodal.processing import MultiModalProcessor, load_multimodal_processor
from minivllm.pooling.params import PoolingParams
from minivllm.sample.logits_processors import check_picklable
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend import check_grammar

PROMPT_KEYS = ("prompt", "prompt_token_ids", "multi_modal_data")
"""The keys of a prompt dict the engine handles; any other is refused."""
EMPTY_IDS = "prompt_token_ids: is empty and the decoder prompt cannot be empty; give at least one token id"


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
        self._check_priority_and_salt(priority, cache_salt)
        self.lora.check(lora_request)
        self.cfg.kv_transfer.check_request_params((params.extra_args or {}).get("kv_transfer_params"))
        text, ids, mm_features = self._tokenize_with_images(prompt, params.truncate_prompt_tokens)
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
        self._check_priority_and_salt(priority, cache_salt)
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

    def _check_priority_and_salt(self, priority: int, cache_salt: str | None) -> None:
        policy = self.cfg.scheduler.policy
        if not isinstance(priority, int):
            raise ValueError(f"priority={priority!r}: must be an int")
        if priority != 0 and policy != "priority":
            raise ValueError(
                f"priority={priority}: needs scheduler.policy=priority, LLM(scheduling_policy='priority') "
                f"(the policy is {policy})"
            )
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"cache_salt={cache_salt!r}: must be a non-empty string or None")
        if cache_salt is not None and self.cfg.parallel.dp > 1:
            raise ValueError("cache_salt: not supported with parallel.dp > 1; leave it None")

    # ---- prompts ---------------------------------------------------------------------
    def tokenize(self, prompt: PromptType, truncate_prompt_tokens: int | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids); ``truncate_prompt_tokens`` keeps only the last k ids (before the checks)."""
        text, ids = self._split(prompt)
        if truncate_prompt_tokens is not None:
            ids = ids[-truncate_prompt_tokens:]
        self._check_ids(ids)
        return text, ids

    def _tokenize_with_images(
        self, prompt: PromptType, truncate_prompt_tokens: int | None
    ) -> tuple[str | None, list[int], list[MultiModalFeature]]:
        """``tokenize``, then a prompt's ``multi_modal_data`` through the model's processor."""
        mm = self.mm
        mm_data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if mm_data is None:
            text, ids = self.tokenize(prompt, truncate_prompt_tokens)
            if mm is not None and mm.image_token_id in ids:
                raise ValueError(
                    f"prompt: holds image placeholder tokens ({mm.image_token!r}) but no image was given; "
                    "pass the images in multi_modal_data (or image_url content parts)"
                )
            return text, ids, []
        if mm is None:
            raise ValueError(f"multi_modal_data: {self.cfg.architecture} takes no images; send text only")
        if truncate_prompt_tokens is not None:
            raise ValueError("truncate_prompt_tokens: cannot be combined with multi_modal_data (it could cut an image)")
        text, ids = self._split(prompt)
        ids, features = mm.process(ids, mm_data)
        self._check_ids(ids)
        return text, ids, features

    def _split(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt, unchecked; text is None for token ids only."""
        if isinstance(prompt, dict) and (unknown := sorted(set(prompt) - set(PROMPT_KEYS))):
            raise ValueError(
                f"prompt: key(s) {', '.join(map(repr, unknown))} not supported by this engine; "
                f"a prompt dict may hold {' and '.join(PROMPT_KEYS)}"
            )
        if isinstance(prompt, str):
            text, ids = prompt, self._encode(prompt)
            if not ids:
                raise ValueError(
                    f"prompt: {prompt!r} tokenizes to no tokens (this tokenizer adds no BOS token) and the "
                    "decoder prompt cannot be empty; give text that tokenizes to at least one token"
                )
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), _as_token_ids(prompt["prompt_token_ids"])
        elif isinstance(prompt, dict) and "prompt" in prompt:
            return self._split(prompt["prompt"])
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            text, ids = None, list(prompt)
        else:
            raise ValueError(
                f"prompt: expected a string, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids'; "
                f"got {type(prompt).__name__}"
            )
        if not ids:
            raise ValueError(EMPTY_IDS)
        return text, ids

    def _encode(self, text: str) -> list[int]:
        """Token ids; transformers' too-long warning is off (the context checks say it better)."""
        return self.tokenizer.encode(text, add_special_tokens=True, verbose=False)

    def _check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError(EMPTY_IDS)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {self.vocab_size})")

    # ---- params ----------------------------------------------------------------------
    def max_output_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """``params.max_tokens`` capped by the room left in max_model_len, after checking ``params``
        and that the request can ever fit the KV cache."""
        room = self.cfg.max_model_len - num_prompt_tokens
        limit = room if params.max_tokens is None else min(params.max_tokens, room)
        self.check_params(params)
        self._check_fits_kv_cache(num_prompt_tokens, limit)
        return limit

    def _check_fits_kv_cache(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a request whose prompt + ``max_tokens`` can never fit the KV cache. A
        sliding-window model holds only its window's blocks (plus one step's) at once."""
        spec, capacity = self.kv_spec, self.kv_capacity_tokens
        step_tokens = self.cfg.scheduler.max_num_batched_tokens
        held = spec.max_blocks_per_request(num_prompt_tokens + max_tokens, step_tokens) * spec.block_size
        if held > capacity:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) can never fit the KV cache "
                f"({capacity} tokens); lower max_tokens or give the cache more memory"
            )

    def check_params(self, params: SamplingParams) -> None:
        """The SamplingParams checks that need the model: logprob caps and token ids (bad words:
        ``prepare_params``); params that travel to other processes must pickle."""
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
        if self.cfg.world_size > 1 or self.engine_in_other_process:
            check_picklable(params)
        if params.structured_outputs is not None:
            check_grammar(params.structured_outputs)

    def prepare_params(self, params: SamplingParams, eos_token_id: int | None) -> SamplingParams:
        """A copy of ``params`` with the token ids the workers need filled in (stop ids, bad words);
        raises ValueError for bad words whose tokens fall outside the vocabulary (they are
        tokenized here, once)."""
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


def _as_token_ids(ids: Any) -> list[int]:
    """``prompt_token_ids`` as Python ints: numpy and torch integers (arrays too) are integers."""
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise ValueError(
            f"prompt_token_ids: must be a list of integer token ids; got {type(ids).__name__} {str(ids)[:80]}"
        ) from None

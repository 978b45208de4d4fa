"""The checks of a request that need the engine's config or model, and the params the
workers get.

``SamplingParams`` checks its own fields when it is built; what it cannot know is
checked here: ``n`` against ``serve.max_n``, logprobs against
``model.max_logprobs``, token ids against the vocabulary, whether the request can
ever fit the KV cache, priority against the scheduler's policy, and that params
pickle when they travel to other processes. Each raises ValueError naming the
field. ``prepare_params`` never changes the caller's params: the workers get a
copy with the stop and bad-word token ids filled in.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import VllmConfig
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.sample.logits_processors import check_picklable
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend import check_grammar


def check_priority_and_salt(cfg: VllmConfig, priority: int, cache_salt: str | None) -> None:
    policy = cfg.scheduler.policy
    if not isinstance(priority, int):
        raise ValueError(f"priority={priority!r}: must be an int")
    if priority != 0 and policy != "priority":
        raise ValueError(
            f"priority={priority}: needs scheduler.policy=priority, LLM(scheduling_policy='priority') "
            f"(the policy is {policy})"
        )
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt={cache_salt!r}: must be a non-empty string or None")
    if cache_salt is not None and cfg.parallel.dp > 1:
        raise ValueError("cache_salt: not supported with parallel.dp > 1; leave it None")


def check_fits_kv_cache(
    kv_spec: KVCacheSpec, capacity_tokens: int, step_tokens: int, num_prompt_tokens: int, max_tokens: int
) -> None:
    """Refuse a request whose prompt + ``max_tokens`` can never fit ``capacity_tokens`` of KV cache.
    A sliding-window model holds only its window's blocks (plus one step's) at once."""
    held = kv_spec.max_blocks_per_request(num_prompt_tokens + max_tokens, step_tokens) * kv_spec.block_size
    if held > capacity_tokens:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) can never fit the KV cache "
            f"({capacity_tokens} tokens); lower max_tokens or give the cache more memory"
        )


def check_params(cfg: VllmConfig, vocab_size: int, params: SamplingParams, crosses_processes: bool) -> None:
    """The SamplingParams checks that need the model: logprob caps and token ids (bad words:
    ``prepare_params``); ``crosses_processes``: the params must pickle."""
    max_n = cfg.serve.max_n
    if params.n > max_n:
        raise ValueError(f"n={params.n}: must be in [1, {max_n}] (serve.max_n={max_n})")
    cap = cfg.model.max_logprobs
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
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ValueError(f"{name}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
    if crosses_processes:
        check_picklable(params)
    if params.structured_outputs is not None:
        check_grammar(params.structured_outputs)


def prepare_params(
    params: SamplingParams, eos_token_id: int | None, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> SamplingParams:
    """A copy of ``params`` with the token ids the workers need filled in; raises ValueError
    for bad words whose tokens fall outside the vocabulary (they are tokenized here, once)."""
    params = params.clone()
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name) == -1:
            setattr(params, name, vocab_size)
    stop_ids = set(params.stop_token_ids)
    if eos_token_id is not None and not params.ignore_eos:
        stop_ids.add(eos_token_id)
    params._all_stop_token_ids = stop_ids
    params._bad_words_token_ids = bad_words_token_ids(tokenizer, vocab_size, params.bad_words or [])
    return params


def bad_words_token_ids(tokenizer: PreTrainedTokenizerBase, vocab_size: int, words: list[str]) -> list[list[int]]:
    """Each word as token ids, alone and after a space. The spaced form is kept only
    when the space merges into the first token (same length, different first id),
    so a word is also banned mid-sentence without banning bare spaces."""
    sequences: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        forms = [bare, spaced] if len(spaced) == len(bare) and spaced[:1] != bare[:1] else [bare]
        for ids in forms:
            if ids and ids not in sequences:
                sequences.append(ids)
    too_big = [t for ids in sequences for t in ids if t >= vocab_size]
    if too_big:
        raise ValueError(f"bad_words: tokenize to ids {too_big[:5]} outside the vocabulary [0, {vocab_size})")
    return sequences

"""The ``LLM`` methods' arguments in their per-prompt form: one prompt or many,
one set of parameters for all prompts or one per prompt."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from minivllm.engine.processor import PromptType
from minivllm.lora_request import LoRARequest
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import RequestOutputKind, SamplingParams

T = TypeVar("T")


def as_list_of_prompts(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: is empty; give at least one prompt")
    return prompts


def per_prompt(value: Any, n: int, name: str, single: type[T], default: Callable[[], T | None]) -> list[T | None]:
    """``value`` broadcast to ``n`` prompts: None (``default()`` for each), one ``single``,
    or a sequence of exactly ``n``."""
    if value is None:
        return [default()] * n
    if isinstance(value, single):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{name}: {len(values)} given for {n} prompts; give one, or one per prompt")
    return values


def params_per_prompt(params: Any, n: int) -> list[SamplingParams]:
    return per_prompt(params, n, "sampling_params", SamplingParams, SamplingParams)


def loras_per_prompt(lora: Any, n: int) -> list[LoRARequest | None]:
    return per_prompt(lora, n, "lora_request", LoRARequest, lambda: None)


def pooling_params_per_prompt(params: Any, n: int, truncate: int | None) -> list[PoolingParams]:
    params = per_prompt(params, n, "pooling_params", PoolingParams, PoolingParams)
    if truncate is not None:
        params = [PoolingParams(p.dimensions, p.normalize, truncate) for p in params]
    return params


def final_only(params: SamplingParams) -> SamplingParams:
    """generate() returns finished outputs only, so it asks for nothing else (as vLLM's LLM does)."""
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params

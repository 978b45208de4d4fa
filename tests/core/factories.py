"""Small builders for scheduler and KV-cache tests (no model, no config files)."""
from __future__ import annotations

from types import SimpleNamespace

from minivllm.core.scheduler import Scheduler
from minivllm.engine.request import Request, RequestId
from minivllm.sampling_params import SamplingParams


def make_request(req_id: str, num_prompt_tokens: int, max_tokens: int = 16, **params) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)
    return Request(RequestId(req_id), list(range(10, 10 + num_prompt_tokens)), sp, eos_token_id=2, max_tokens=max_tokens)


def make_scheduler(
    num_blocks: int,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    chunked_prefill: bool = True,
) -> Scheduler:
    cfg = SimpleNamespace(
        scheduler=SimpleNamespace(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=chunked_prefill,
            policy="fcfs",
        ),
        cache=SimpleNamespace(block_size=block_size, enable_prefix_caching=False),
    )
    return Scheduler(cfg, num_blocks)

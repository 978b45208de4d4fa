"""What a worker remembers about a request between steps."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.engine.request import RequestId
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    req_id: RequestId
    token_ids: list[int]
    """Every token known so far: prompt, then the outputs the scheduler sent back."""
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None
    """The request's own noise source when it has a seed; see ``seeded_generator``."""
    prompt_logprobs: list[dict[int, float] | None] | None = None
    """Prompt logprobs gathered chunk by chunk (entry ``j`` is prompt token ``j``; entry 0
    is None), sent with the first sampled token; None when not asked or already sent."""

    def add_prompt_logprobs(self, first_token: int, entries: list[dict[int, float]]) -> None:
        """Entries for prompt tokens ``first_token ..``; tokens skipped before it
        (KV reused from a cache, so never computed here) get None."""
        missing = first_token - len(self.prompt_logprobs)
        self.prompt_logprobs.extend([None] * missing)
        self.prompt_logprobs.extend(entries)

    def seeded_generator(self) -> torch.Generator | None:
        """The request's generator, re-seeded for the output position about to be
        sampled: the noise depends only on (seed, position), so a seeded request
        samples the same tokens whatever the batch and across preemptions."""
        if self.generator is None:
            return None
        position = len(self.token_ids) - self.num_prompt_tokens
        self.generator.manual_seed((self.sampling_params.seed * 1_000_003 + position) % (1 << 63))
        return self.generator

    @classmethod
    def from_new(cls, new: NewRequestData, device: torch.device) -> "CachedRequestState":
        seeded = new.sampling_params.seed is not None
        generator = torch.Generator(device=device) if seeded else None
        # After a preemption the prompt logprobs were already sent with the first output.
        asked = new.sampling_params.prompt_logprobs is not None
        wants_prompt_logprobs = asked and len(new.token_ids) == new.num_prompt_tokens
        return cls(
            req_id=new.req_id,
            token_ids=list(new.token_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            sampling_params=new.sampling_params,
            block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
            generator=generator,
            prompt_logprobs=[None] if wants_prompt_logprobs else None,
        )

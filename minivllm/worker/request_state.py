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
        return cls(
            req_id=new.req_id,
            token_ids=list(new.token_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            sampling_params=new.sampling_params,
            block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
            generator=generator,
        )

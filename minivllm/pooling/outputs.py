"""What ``LLM.encode`` / ``LLM.embed`` return (vLLM's classes and fields)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PoolingOutput:
    data: torch.Tensor
    """(H,) or (dimensions,) fp32: the pooled (and finished) vector."""


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls(out.request_id, EmbeddingOutput(out.outputs.data.tolist()), out.prompt_token_ids, out.finished)

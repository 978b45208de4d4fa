"""Token embedding and LM head, split over tensor-parallel ranks by vocabulary.

Rank r holds rows ``[r * V/tp, (r+1) * V/tp)`` of the (padded) vocabulary. The
embedding looks up the ids it owns, zeroes the rest and all-reduces; the LM head
computes its slice of the logits and all-gathers them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.parallel_state import all_gather_last_dim, all_reduce, tp_rank, tp_size
from minivllm.layers.weight_utils import copy_checked, loaded_shape, narrow
from minivllm.quantization.base import (
    CpuPackedWeight,
    cpu_linear,
    pack_cpu_weight,
    packable_on_cpu,
    place_cpu_weight,
)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp_size)  # the last shard is padded
        self.vocab_start = self.tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        rows = max(0, min(self.shard_size, loaded_shape(loaded)[0] - self.vocab_start))
        param.data.zero_()
        copy_checked(param.data[:rows], narrow(loaded, 0, self.vocab_start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, hidden)
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        owned = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight)
        out = out * owned.unsqueeze(-1).to(out.dtype)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits; may share the embedding's weight."""

    cpu_packed_weight: CpuPackedWeight | None = None
    """The weight packed for the CPU's matmul (``device.cpu_packed_linear``); None: F.linear."""

    def __init__(self, vocab_size: int, hidden_size: int, bias: bool = False) -> None:
        super().__init__(vocab_size, hidden_size)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.shard_size), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding's weight. The link is kept (outside the module tree)
        so ``retie()`` can restore it after the model is materialised off the meta device."""
        self.__dict__["_tied_embedding"] = embedding
        self.weight = embedding.weight

    def retie(self) -> None:
        embedding = self.__dict__.get("_tied_embedding")
        if embedding is not None:
            self.weight = embedding.weight

    def pack_for_cpu(self) -> bool:
        """Hold the weight packed for the CPU (``pack_cpu_weight``) where it is on the CPU in fp32
        or bf16 (a tied weight too: the embedding keeps looking up the plain one); returns whether it did."""
        if not packable_on_cpu(self.weight):
            return False
        self.weight.data = place_cpu_weight(self.weight.data)
        self.cpu_packed_weight = pack_cpu_weight(self.weight)
        return True

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        packed = self.cpu_packed_weight
        if packed is not None:
            logits = cpu_linear(hidden, self.weight, packed, self.bias)
        else:
            logits = F.linear(hidden, self.weight, self.bias)
        logits = all_gather_last_dim(logits)
        if logits.shape[-1] != self.vocab_size:  # padded vocabulary shards
            logits = logits[:, : self.vocab_size]
        return logits if logits.dtype == torch.float32 else logits.float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden)

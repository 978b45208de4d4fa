"""The contract between the model runner, attention layers and attention backends.

The paged KV cache of one layer is a single tensor::

    kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim)
               ^ 0 = keys, 1 = values

A token's *slot* is ``block_id * block_size + offset``; the runner computes a
slot for every new token (``slot_mapping``) and a block table per request.
A batch is flat: the new tokens of all scheduled requests are concatenated,
request after request, so one step can mix prefill chunks and decode tokens::

    tokens:          [ r0 r0 r0 r0 | r1 | r2 r2 ]      T = 7 new tokens
    query_start_loc: [0,            4,   5,     7]     (B + 1,)
    seq_lens:        [ 4,            9,   12     ]     cached + new, per request

Request ``i``'s queries are the last ``query_len_i`` positions of its
``seq_lens[i]`` tokens, so query ``j`` of request ``i`` attends causally to
positions ``0 .. seq_lens[i] - query_len_i + j`` (all already written to the
cache by ``write_kv`` before attention runs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """Per-step inputs that every attention layer reads. Built once per step by
    the model runner and passed down explicitly (no global context)."""

    slot_mapping: torch.Tensor
    """(T,) int64: cache slot of each new token."""
    query_start_loc: torch.Tensor
    """(B + 1,) int32: prefix sums of the new-token counts per request."""
    seq_lens: torch.Tensor
    """(B,) int32: tokens in context per request after this step (cached + new)."""
    block_tables: torch.Tensor
    """(B, max_blocks_per_seq) int32: physical block ids; unused entries are 0."""
    max_query_len: int
    """Largest number of new tokens of one request in this step."""
    max_seq_len: int
    """Largest ``seq_lens`` entry in this step."""
    query_lens_cpu: Sequence[int]
    """(B,) host copy of the new-token counts: a list, or the int numpy array the
    runner has (backends that loop or index on the host read it)."""
    seq_lens_cpu: Sequence[int]
    """(B,) host copy of ``seq_lens``, likewise."""
    query_start_loc_cpu: np.ndarray | None = None
    """(B + 1,) host copy of ``query_start_loc`` when the runner has one (backends that
    index on the host use it instead of reading the device)."""
    block_tables_cpu: np.ndarray | None = None
    """(B, max_blocks_per_seq) host copy of ``block_tables``, likewise."""
    has_padding: bool | None = None
    """Whether some ``slot_mapping`` entries are -1 (padding tokens whose keys are not
    stored); None: unknown, and a backend that cares reads ``slot_mapping`` to learn it."""
    backend_data: Any = None
    """What ``AttentionBackend.prepare`` derived for this step (shared by all layers)."""
    mla_plan: Any = None
    """MLA layers' per-step index tensors (``attention/mla.py``), built by the first of them."""
    state_indices: torch.Tensor | None = None
    """(B,) int32: each request's state slot in the linear-attention layers' state tensors
    (hybrid models, ``models/qwen3_next.py``); None for a model without such layers."""
    has_initial_state: torch.Tensor | None = None
    """(B,) bool: whether each request continues from its slot's states (tokens computed before
    this step), else starts from zeros; None with ``state_indices``."""

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


class AttentionBackend(ABC):
    """Writes new keys/values into the paged cache and computes attention.

    One instance is shared by every attention layer of a model; per-layer
    properties (scale, window, soft-cap) arrive as arguments.
    """

    name: str = "abstract"

    def prepare(self, meta: AttentionMetadata, block_size: int) -> Any:
        """Per-step work that every layer would otherwise repeat (index tensors,
        masks, split points). Called once per step by the model runner; the
        result is stored as ``meta.backend_data``."""
        return None

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # (T, num_heads, head_dim)
        key: torch.Tensor,  # (T, num_kv_heads, head_dim)
        value: torch.Tensor,  # (T, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        sinks: torch.Tensor | None = None,  # (num_heads,)
    ) -> torch.Tensor:  # (T, num_heads, head_dim)
        """Store ``key``/``value`` at ``meta.slot_mapping``, then attend.

        An fp8 ``kv_cache`` (float8_e4m3fn) stores ``key / k_scale`` and ``value / v_scale``
        and reads them back multiplied by the scale (``attention/kv_quant.py``); the layer
        passes the scales only for such a cache.

        ``sliding_window=w`` lets a query at position p see positions
        ``p - w + 1 .. p`` (w tokens, itself included), as in Mistral/HF.
        ``logits_soft_cap=c`` replaces each score s by ``c * tanh(s / c)``.
        ``sinks`` (gpt-oss) holds one learned logit per head that joins the softmax's
        denominator and contributes no value: ``out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^sink)``.
        A backend without them raises ``NotImplementedError`` when given some
        (``check_no_sinks``).
        """

    def forward_mla(
        self,
        q_nope: torch.Tensor,  # (T, num_heads, qk_nope_head_dim)
        q_pe: torch.Tensor,  # (T, num_heads, qk_rope_head_dim), rotated
        latent: torch.Tensor,  # (T, kv_lora_rank + qk_rope_head_dim): [c ; k_pe], k_pe rotated
        kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim)
        meta: AttentionMetadata,
        *,
        w_uk: torch.Tensor,  # (num_heads, qk_nope_head_dim, kv_lora_rank)
        w_uv: torch.Tensor,  # (num_heads, v_head_dim, kv_lora_rank)
        scale: float,
        k_scale: float = 1.0,
    ) -> torch.Tensor:  # (T, num_heads, v_head_dim)
        """Multi-head Latent Attention (DeepSeek V2/V3, ``attention/mla.py``): store ``latent`` at
        ``meta.slot_mapping`` in the latent cache, then attend. A separate entry from ``forward``:
        the cache holds one latent per token, not per-head keys and values."""
        raise NotImplementedError(f"attention backend {self.name!r} has no MLA path (DeepSeek V2/V3); use torch")


def check_no_sinks(backend: AttentionBackend, sinks: torch.Tensor | None) -> None:
    """For a backend that cannot apply attention sinks: refuse them instead of ignoring them."""
    if sinks is not None:
        raise NotImplementedError(
            f"the {backend.name!r} attention backend has no attention sinks (gpt-oss needs them); "
            "use attention=torch or attention=triton"
        )

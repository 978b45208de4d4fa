"""What the engine learns about the KV cache from the workers, once they have loaded the model.

The config only describes the model; facts that need the model itself come
back from the worker that built it (vLLM's ``get_kv_cache_spec`` ->
``KVCacheConfig``, rolled into one small value)::

    Worker.determine_kv_cache_spec()      blocks that fit + the loaded model's window
      -> Executor.determine_kv_cache_spec()   merged over ranks (KVCacheSpec.merge)
        -> EngineCore.kv_spec ─┬─> Scheduler(cfg, kv_spec)    KV-cache manager frees out-of-window blocks
                               ├─> Processor(cfg, tok, spec)  "can never fit the KV cache"
                               └─> EngineReady (ready message) front ends: AsyncLLM, data-parallel

It sits on the ground floor because it crosses all of those layers; it imports
nothing from the engine's packages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from minivllm.utils import cdiv


@dataclass(frozen=True)
class KVCacheSpec:
    """The paged KV cache the scheduler plans with."""

    block_size: int
    """Tokens per block (``cache.block_size``)."""
    num_blocks: int
    """Blocks that fit on every rank (the minimum over them)."""
    sliding_window: int | None = None
    """Window behind which blocks are freed: set when every attention layer of the loaded
    model slides (the widest window), None when any attends globally."""
    block_bytes: int = field(default=0, compare=False)
    """Bytes one block takes on a rank, over all its KV layers (0: not reported): what a token
    really costs. Per-head K/V: 2 * kv_heads * head_dim values per token and layer; MLA
    (DeepSeek): one latent of kv_lora_rank + qk_rope_head_dim values. Informational: the
    scheduler plans in blocks, so equal plans compare equal whatever it says. A KV connector
    moves blocks of this size (``kv_transfer/``)."""

    num_state_slots: int = 0
    """Hybrid models (linear-attention layers): fixed-size state slots beside the blocks, one per
    request that can run at once (``max_num_seqs``); 0 for a model without such layers. The
    KV-cache manager admits a request only with a free slot, so it is part of the plan."""
    state_slot_bytes: int = field(default=0, compare=False)
    """Bytes one request's states take on a rank over its linear-attention layers (conv state
    and recurrent state), whatever its length; 0 without such layers. Informational, as
    ``block_bytes``: ranks of tp > 1 each hold their heads' share."""

    @property
    def state_bytes(self) -> int:
        """Bytes all state slots take on a rank."""
        return self.num_state_slots * self.state_slot_bytes

    @property
    def bytes_per_token(self) -> float:
        """``block_bytes`` per token (0 when not reported)."""
        return self.block_bytes / self.block_size

    @property
    def num_tokens(self) -> int:
        """Tokens the whole cache holds."""
        return self.num_blocks * self.block_size

    def max_blocks_per_request(self, num_tokens: int, max_step_tokens: int) -> int:
        """KV blocks a request of ``num_tokens`` tokens holds at most at once, when each step
        computes at most ``max_step_tokens`` of its tokens (``core/kv_cache_manager.py``)."""
        return max_blocks_per_request(num_tokens, self.block_size, self.sliding_window, max_step_tokens)

    @classmethod
    def merge(cls, specs: Iterable[KVCacheSpec]) -> KVCacheSpec:
        """The spec every rank (or data-parallel replica) can honour: the fewest blocks, and a
        window only when each of them has one (the widest, as for the layers of one model).
        Pipeline stages hold different layers, so one stage with a global layer keeps every block."""
        specs = list(specs)
        if not specs:
            raise ValueError("KVCacheSpec.merge: no specs to merge")
        sizes = {s.block_size for s in specs}
        if len(sizes) != 1:
            raise ValueError(f"KVCacheSpec.merge: ranks disagree on cache.block_size: {sorted(sizes)}")
        windows = [s.sliding_window for s in specs]
        window = None if any(w is None for w in windows) else max(windows)
        block_bytes = max(s.block_bytes for s in specs)  # pipeline stages differ: the largest rank's
        slots = min(s.num_state_slots for s in specs)
        slot_bytes = max(s.state_slot_bytes for s in specs)
        return cls(specs[0].block_size, min(s.num_blocks for s in specs), window, block_bytes, slots, slot_bytes)


def max_blocks_per_request(num_tokens: int, block_size: int, window: int | None, max_step_tokens: int) -> int:
    """The most blocks a request of ``num_tokens`` tokens holds at once, when each
    step computes at most ``max_step_tokens`` of its tokens. With a window, a step
    holds the span from ``window - 1`` tokens before its first new token to its
    last one, which touches at most ``cdiv(span, block_size) + 1`` blocks."""
    blocks = cdiv(num_tokens, block_size)
    if window is None:
        return blocks
    return min(blocks, cdiv(window - 1 + max_step_tokens, block_size) + 1)

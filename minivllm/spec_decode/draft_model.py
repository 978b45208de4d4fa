"""The draft model: a small model of the target's tokenizer that proposes the drafts.

It lives in the target's model runner and runs after the target's step, as in
vLLM v1 (the drafts travel back in ``ModelRunnerOutput.spec_token_ids`` and the
scheduler schedules them next step):

1. ``catch_up``: a forward pass over exactly the target's step inputs (same
   tokens, positions, slots), so the draft's KV cache holds every token the
   target's holds. Rejected drafts' KV is overwritten later, as the target's.
2. ``propose``: for each request that sampled, ``k`` single-token passes: the
   request's newest token at position ``P`` (its first token without KV), then
   each draft after the previous one, sampled from the draft's distribution with
   the request's temperature / top-k / top-p (greedy requests: argmax).

**One paged cache, two sets of tensors.** The draft has its own KV tensors, one
per draft layer, but shares the target's block tables and block ids: block ``b``
holds positions of the same request in both. So allocation, prefix caching,
preemption and rollback stay one mechanism (a cached block's draft KV was
written by the ``catch_up`` that wrote its target KV), and the memory profiling
counts the draft's bytes per block beside the target's. Proposal passes write
positions ``P .. P + k - 1`` into slots the scheduler reserved as *lookahead*
(``spec_decode/scheduling.py``); a request with fewer reserved slots gets fewer
drafts. Those slots hold no known token's KV yet, so nothing shared is touched.

Sampled drafts keep their distributions (``draft_probs``) for the rejection
sampler, which accepts with ``min(1, p / q)``; greedy drafts are one-hot.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.request import RequestId
from minivllm.layers.rotary import share_cos_sin_caches
from minivllm.sample.metadata import from_batch
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.scheduling import may_speculate
from minivllm.utils import build
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs

_DRAFT_SEED_OFFSET = 1 << 62
"""Seeded requests draw draft noise from (seed, position + offset): never the verifier's stream."""


class DraftModelProposer:
    def __init__(self, cfg: VllmConfig, sampler: Sampler, device: torch.device) -> None:
        self.cfg = cfg.draft_config
        self.k = cfg.speculative.num_speculative_tokens
        self.block_size = cfg.cache.block_size
        self.sampler = sampler
        self.device = device
        self.model: nn.Module | None = None
        self.layers: list[nn.Module] = []
        self.backend: AttentionBackend | None = None
        self.draft_probs: dict[RequestId, torch.Tensor] = {}
        """(n, V) fp32 distribution of each of a sampling request's latest n drafts (greedy: absent)."""

    # ---- set-up -------------------------------------------------------------------
    def load_model(self, backend: AttentionBackend) -> None:
        self.backend = backend
        self.model = build(self.cfg.load.loader).load_model(self.cfg, backend, self.device)
        share_cos_sin_caches(self.model, self.cfg.max_model_len, self.device)
        self.layers = [m for m in self.model.modules() if hasattr(m, "kv_cache") and hasattr(m, "backend")]

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def kv_cache_bytes_per_block(self) -> int:
        layer = self.layers[0]
        per_layer = 2 * self.block_size * layer.num_kv_heads * layer.head_dim
        return per_layer * len(self.layers) * self.cfg.kv_cache_dtype.itemsize

    def init_kv_cache(self, num_blocks: int) -> None:
        """The draft's tensors for the target's ``num_blocks`` blocks (None: release them)."""
        for layer in self.layers:
            shape = (2, num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            layer.kv_cache = torch.zeros(shape, dtype=self.cfg.kv_cache_dtype, device=self.device)

    def release_kv_cache(self) -> None:
        for layer in self.layers:
            layer.kv_cache = None

    # ---- one step -----------------------------------------------------------------
    @torch.inference_mode()
    def catch_up(self, step: StepInputs) -> None:
        """Write the draft's KV for every token of the target's step."""
        self.model(step.input_ids, step.positions, step.meta)

    @torch.inference_mode()
    def propose(self, batch: InputBatch, req_ids: list[RequestId]) -> dict[RequestId, list[int]]:
        """Drafts for the requests in ``req_ids`` (those that sampled this step) that may speculate."""
        self.draft_probs = {}
        rows = np.asarray([batch.row_of[r] for r in req_ids if may_speculate(batch.params[batch.row_of[r]])],
                          dtype=np.int64)  # fmt: skip
        if not len(rows):
            return {}
        start = batch.num_tokens[rows].astype(np.int64) - 1  # (B,) the newest token, no KV yet
        room = np.minimum(
            batch.block_table.num_blocks[rows].astype(np.int64) * self.block_size,  # reserved slots
            self.cfg.max_model_len,
        ) - start
        n = np.minimum(np.minimum(room, self._outputs_left(batch, rows)), self.k)  # (B,) drafts per request
        rows, start, n = rows[n > 0], start[n > 0], n[n > 0]
        if not len(rows):
            return {}
        tokens = torch.from_numpy(batch.token_ids[rows, start].astype(np.int64)).to(self.device)  # (B,)
        live = np.arange(len(rows))  # requests still drafting, ascending; ``tokens`` is theirs
        drafts, probs = [], []
        for j in range(int(n.max())):
            keep = np.flatnonzero(n[live] > j)
            if len(keep) < len(live):
                live, tokens = live[keep], tokens[torch.from_numpy(keep).to(self.device)]
            tokens, q = self._draft_one(batch, rows[live], start[live] + j, tokens)
            drafts.append((live, tokens))
            probs.append((live, q))
        return self._collect(batch, rows, n, drafts, probs)

    @staticmethod
    def _outputs_left(batch: InputBatch, rows: np.ndarray) -> np.ndarray:
        """(B,) drafts the scheduler could still use: the last output token needs none after it."""
        made = batch.num_tokens[rows].astype(np.int64) - batch.num_prompt_tokens[rows]
        limit = [batch.params[r].max_tokens for r in rows.tolist()]
        return np.asarray([(m if m is not None else 1 << 30) for m in limit], dtype=np.int64) - made - 1

    def _draft_one(
        self, batch: InputBatch, rows: np.ndarray, positions: np.ndarray, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass: (B,) tokens at (B,) positions in, (B,) next drafts and their (B, V) q (None if all greedy) out."""
        meta = self._decode_metadata(batch, rows, positions)
        hidden = self.model(tokens, torch.from_numpy(positions).to(self.device), meta)  # (B, hidden)
        logits = self.model.compute_logits(hidden)  # (B, V) fp32
        sampling = from_batch(batch, rows, logits.shape[-1], self.device)
        if sampling.all_greedy:
            return logits.argmax(dim=-1), None
        q = self.sampler.process(logits, sampling).softmax(dim=-1)  # (B, V)
        noise = torch.empty_like(q).exponential_(generator=self.sampler.generator)
        for i, row in enumerate(rows.tolist()):
            seed = batch.params[row].seed
            if seed is not None:
                position = int(positions[i]) + 1 - int(batch.num_prompt_tokens[row]) + _DRAFT_SEED_OFFSET
                gen = batch.generators[batch.req_ids[row]].manual_seed((seed * 1_000_003 + position) % (1 << 63))
                noise[i].exponential_(generator=gen)
        drawn = torch.where(sampling.temperature == 0.0, logits.argmax(dim=-1), q.div(noise).argmax(dim=-1))
        return drawn, q

    def _decode_metadata(self, batch: InputBatch, rows: np.ndarray, positions: np.ndarray) -> AttentionMetadata:
        """Attention inputs of one token per row at ``positions``, in the rows' own blocks."""
        table = batch.block_table.table
        seq_lens = positions + 1  # (B,)
        width = int(-(-seq_lens.max() // self.block_size))
        slots = table[rows, positions // self.block_size].astype(np.int64) * self.block_size + positions % self.block_size
        B = len(rows)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots).to(self.device),
            query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=self.device),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(self.device),
            block_tables=torch.from_numpy(np.ascontiguousarray(table[rows, :width])).to(self.device),
            max_query_len=1,
            max_seq_len=int(seq_lens.max()),
            query_lens_cpu=[1] * B,
            seq_lens_cpu=seq_lens.tolist(),
        )
        meta.backend_data = self.backend.prepare(meta, self.block_size)
        return meta

    def _collect(self, batch: InputBatch, rows: np.ndarray, n: np.ndarray, drafts: list, probs: list) -> dict:
        """Per request its drafts (host lists) and, for sampling requests, their (n, V) distributions."""
        out: dict[RequestId, list[int]] = {}
        host = [(live, tokens.tolist()) for live, tokens in drafts]
        for i, row in enumerate(rows.tolist()):
            req_id = batch.req_ids[row]
            out[req_id] = [toks[int(np.searchsorted(live, i))] for live, toks in host[: int(n[i])]]
            if batch.temperature[row] > 0.0:
                self.draft_probs[req_id] = torch.stack(
                    [q[int(np.searchsorted(live, i))] for live, q in probs[: int(n[i])]]
                )  # (n, V)
        return out

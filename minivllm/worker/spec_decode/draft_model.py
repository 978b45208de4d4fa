"""The draft model: a small model of the target's tokenizer that proposes the drafts.

It lives in the target's model runner and runs after the target's step, as in
vLLM v1 (the drafts travel back in ``ModelRunnerOutput.spec_token_ids`` and the
scheduler schedules them next step). Per step, once the target's tokens are
verified and appended to the persistent batch:

1. the catch-up pass: the step's rows again, each from its first new position
   to its newest known token (accepted drafts and the target's new token in,
   rejected drafts out). It writes the draft's KV wherever the target's step
   wrote the target's (plus the new token), and its last position's logits give
   each sampling request its first draft;
2. ``k - 1`` single-token passes, each draft after the previous one. Drafts are
   sampled from the draft's distribution with the request's temperature / min-p /
   top-k / top-p (greedy requests: argmax).

**One paged cache, two sets of tensors.** The draft has its own KV tensors, one
per draft layer, but shares the target's block tables and block ids: block ``b``
holds positions of the same request in both. So allocation, prefix caching,
preemption and rollback stay one mechanism (a cached block's draft KV was
written by the catch-up after the step that wrote its target KV), and the memory
profiling counts the draft's weights and bytes per block beside the target's. The
newest token ``P`` and the drafts at ``P + 1 .. P + k - 1`` go into slots the
scheduler reserved as *lookahead* (``core/spec_decode.py``); a request with
fewer reserved slots gets fewer drafts. Those slots hold no known token's KV of a
full block, so nothing shared is touched.

Sampled drafts keep their distributions (``draft_probs``) for the rejection
sampler, which accepts with ``min(1, p / q)``; greedy drafts are one-hot.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.config.vllm_config import VllmConfig
from minivllm.layers.attention import attention_layers
from minivllm.layers.rotary import share_cos_sin_caches
from minivllm.request import RequestId
from minivllm.sample.metadata import may_speculate
from minivllm.sample.sampler import Sampler
from minivllm.utils import cdiv, instantiate_target
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputBuilder, StepInputs

_DRAFT_SEED_OFFSET = 1 << 62
"""Seeded requests draw draft noise from (seed, position + offset): never the verifier's stream."""


class DraftModelProposer:
    shift = 0
    """How far past the KV slot it fills an input token sits: 0 for a draft model; 1 for an
    EAGLE head, whose entry at position p reads token p + 1 beside the target's hidden state at p."""

    def __init__(self, cfg: VllmConfig, sampler: Sampler, device: torch.device) -> None:
        self.cfg = cfg.draft_config
        self.k = cfg.speculative.num_speculative_tokens
        self.block_size = cfg.cache.block_size
        self.sampler = sampler
        self.device = device
        self.model: nn.Module | None = None
        self.layers: list[nn.Module] = []
        self.backend: AttentionBackend | None = None
        self.inputs = StepInputBuilder(
            cfg.scheduler.max_num_batched_tokens + cfg.scheduler.max_num_seqs,  # + each row's new token
            cfg.scheduler.max_num_seqs,
            cdiv(cfg.max_model_len, self.block_size),
            self.block_size,
            device,
        )
        """The catch-up pass's inputs (its own staging: the target's step inputs stay intact)."""
        self.draft_probs: dict[RequestId, torch.Tensor] = {}
        """(n, V) fp32 distribution of each of a sampling request's latest n drafts (greedy: absent)."""

    # ---- set-up -------------------------------------------------------------------
    def load_model(self, backend: AttentionBackend, target: nn.Module) -> None:
        """Load the draft (``target``: the target model, which an EAGLE head shares weights with)."""
        self.backend = backend
        self.model = instantiate_target(self.cfg.load.loader).load_model(self.cfg, backend, self.device)
        share_cos_sin_caches(self.model, self.cfg.max_model_len, self.device)
        self.layers = attention_layers(self.model)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def kv_cache_bytes_per_block(self) -> int:
        layer = self.layers[0]
        per_layer = 2 * self.block_size * layer.num_kv_heads * layer.head_dim
        return per_layer * len(self.layers) * self.cfg.kv_cache_dtype.itemsize

    def init_kv_cache(self, num_blocks: int) -> None:
        """The draft's tensors for the target's ``num_blocks`` blocks (the same block ids)."""
        for layer in self.layers:
            shape = (2, num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            layer.kv_cache = torch.zeros(shape, dtype=self.cfg.kv_cache_dtype, device=self.device)

    def release_kv_cache(self) -> None:
        for layer in self.layers:
            layer.kv_cache = None

    # ---- one step -----------------------------------------------------------------
    @torch.inference_mode()
    def catch_up(self, step: StepInputs) -> None:
        """A draft pass over exactly the target's step inputs (the memory profile's)."""
        self.model(step.input_ids, step.positions, step.meta)

    @torch.inference_mode()
    def propose(self, batch: InputBatch, step: StepInputs, target_hidden: torch.Tensor) -> dict[RequestId, list[int]]:
        """After the target's step (its tokens verified and appended to ``batch``): the draft's
        catch-up pass, then drafts for the requests that reached their newest token and may speculate."""
        self.draft_probs = {}
        inputs = self._catch_up_inputs(batch, step)
        if inputs is None:
            return {}
        hidden = self._catch_up_pass(inputs, step, target_hidden)  # (T', hidden)
        rows = inputs.rows
        start = batch.num_tokens[rows].astype(np.int64) - 1  # (B,) the newest token's position
        reached = batch.num_computed_tokens[rows] + inputs.query_lens == start + 1 - self.shift
        room = (
            np.minimum(batch.block_table.num_blocks[rows].astype(np.int64) * self.block_size, self.cfg.max_model_len)
            - start
            + self.shift
        )
        params = batch.sampling.params
        speculating = np.fromiter((may_speculate(params[r]) for r in rows.tolist()), bool, len(rows))
        n = np.minimum(np.minimum(room, self._outputs_left(batch, rows)), self.k)
        chosen = np.flatnonzero(reached & speculating & (n > 0))
        if not len(chosen):
            return {}
        rows, start, n = rows[chosen], start[chosen], n[chosen]
        ends = inputs.query_start[1:][chosen].astype(np.int64) - 1  # each chosen row's last catch-up token
        last = hidden[torch.from_numpy(ends).to(self.device)]  # (B, hidden)
        tokens, q = self._sample(self._logits(last), batch, rows, start + 1)
        drafts, probs, live = [(np.arange(len(rows)), tokens)], [(np.arange(len(rows)), q)], np.arange(len(rows))
        for j in range(1, int(n.max())):
            keep = np.flatnonzero(n[live] > j)
            if len(keep) < len(live):
                index = torch.from_numpy(keep).to(self.device)
                live, tokens, last = live[keep], tokens[index], last[index]
            last = self._decode_pass(batch, rows[live], start[live] + j - self.shift, tokens, last)
            tokens, q = self._sample(self._logits(last), batch, rows[live], start[live] + j + 1)
            drafts.append((live, tokens))
            probs.append((live, q))
        return self._collect(batch, rows, n, drafts, probs)

    def _catch_up_inputs(self, batch: InputBatch, step: StepInputs) -> StepInputs | None:
        """The step's rows again, each from its first new position up to its last known token
        (accepted drafts and the new token included, rejected drafts not) less ``shift``,
        where it has a slot; input tokens are read ``shift`` positions on."""
        computed = batch.num_computed_tokens[step.rows]  # (B,) before the step
        ends = computed + step.query_lens
        sampled = step.rows[step.sample_idx]
        reserved = batch.block_table.num_blocks[sampled].astype(np.int64) * self.block_size
        ends[step.sample_idx] = np.minimum(batch.num_tokens[sampled] - self.shift, reserved)
        lens = (ends - computed).astype(np.int32)
        keep = np.flatnonzero(lens > 0)
        if not len(keep):
            return None
        inputs = self.inputs.build(batch, step.rows[keep], lens[keep])
        if self.shift:
            shifted = batch.token_ids[inputs.token_rows, inputs.token_positions + self.shift].astype(np.int64)
            inputs.input_ids = torch.from_numpy(shifted).to(self.device)
        inputs.meta.backend_data = self.backend.prepare(inputs.meta, self.block_size)
        return inputs

    def _catch_up_pass(self, inputs: StepInputs, step: StepInputs, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.model(inputs.input_ids, inputs.positions, inputs.meta)

    def _decode_pass(
        self, batch: InputBatch, rows: np.ndarray, positions: np.ndarray, tokens: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        """One token per row at ``positions``: (B,) tokens in, (B, hidden) out (``last``: the
        previous pass's hidden states, which an EAGLE head reads)."""
        meta = self._decode_metadata(batch, rows, positions)
        return self.model(tokens, torch.from_numpy(positions).to(self.device), meta)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)  # (B, V) fp32

    def _sample(
        self, logits: torch.Tensor, batch: InputBatch, rows: np.ndarray, positions: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) drafts for ``positions`` and their (B, V) distributions (None when all greedy)."""
        sampling = batch.sampling.metadata(rows)
        if sampling.all_greedy:
            return logits.argmax(dim=-1), None
        q = self.sampler.process(logits, sampling).softmax(dim=-1)  # (B, V)
        noise = torch.empty_like(q).exponential_(generator=self.sampler.generator)
        for i, row in enumerate(rows.tolist()):
            if row in batch.sampling.seeded:
                position = int(positions[i]) - int(batch.num_prompt_tokens[row]) + _DRAFT_SEED_OFFSET
                noise[i].exponential_(generator=batch.sampling.generator(row, position))
        drawn = torch.where(sampling.temperature == 0.0, logits.argmax(dim=-1), q.div(noise).argmax(dim=-1))
        return drawn, q

    @staticmethod
    def _outputs_left(batch: InputBatch, rows: np.ndarray) -> np.ndarray:
        """(B,) drafts the scheduler could still use: the last output token needs none after it."""
        made = batch.num_tokens[rows].astype(np.int64) - batch.num_prompt_tokens[rows]
        limit = [batch.sampling.params[r].max_tokens for r in rows.tolist()]
        return np.asarray([(m if m is not None else 1 << 30) for m in limit], dtype=np.int64) - made - 1

    def _decode_metadata(self, batch: InputBatch, rows: np.ndarray, positions: np.ndarray) -> AttentionMetadata:
        """Attention inputs of one token per row at ``positions``, in the rows' own blocks."""
        table = batch.block_table.table
        seq_lens = positions + 1  # (B,)
        width = int(-(-seq_lens.max() // self.block_size))
        blocks = table[rows, positions // self.block_size].astype(np.int64)
        slots = blocks * self.block_size + positions % self.block_size
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
            has_padding=False,  # one real slot per row
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
            if not batch.sampling.params[row].greedy:
                self.draft_probs[req_id] = torch.stack(
                    [q[int(np.searchsorted(live, i))] for live, q in probs[: int(n[i])]]
                )  # (n, V)
        return out

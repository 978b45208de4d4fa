"""The model runner: scheduler output in, sampled tokens out, on one device.

Per step it (1) folds the scheduler's deltas into its request states, (2) lays
out the flat batch (token ids, positions, slot mapping, block tables),
(3) runs the model, and (4) samples for the requests whose known tokens are now
all computed (a request mid-way through a chunked prefill samples nothing).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch
from torch import nn

from minivllm.attention.backend import AttentionMetadata
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.engine.request import RequestId
from minivllm.layers.compile import compile_small_ops
from minivllm.pooling.pooler import Pooler
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.prompt_logprobs import add_prompt_logprobs
from minivllm.sample.sampler import Sampler, SamplerOutput
from minivllm.utils import build, cdiv
from minivllm.worker.cuda_graphs import CUDAGraphRunner
from minivllm.worker.request_state import CachedRequestState

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: VllmConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.block_size = cfg.cache.block_size
        self.model: nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.requests: dict[RequestId, CachedRequestState] = {}
        self.cuda_graphs: CUDAGraphRunner | None = None
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(cfg.model.seed))
        self.pooler = Pooler(cfg.model.pooler_config.pooling_type) if cfg.model.runner == "pooling" else None

    # ---- set-up -------------------------------------------------------------------
    def load_model(self) -> None:
        self.attn_backend = build(self.cfg.attention.backend)
        loader = build(self.cfg.load.loader)
        self.model = loader.load_model(self.cfg, self.attn_backend, self.device)
        if self.cfg.compilation.torch_compile:
            compile_small_ops(self.model)
        self.attention_layers = [m for m in self.model.modules() if hasattr(m, "kv_cache") and hasattr(m, "backend")]

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        layer = self.attention_layers[0]
        return (2, num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)

    def kv_cache_bytes_per_block(self) -> int:
        per_layer = int(np.prod(self.kv_cache_shape(1)))
        return per_layer * len(self.attention_layers) * self.cfg.kv_cache_dtype.itemsize

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate one (2, num_blocks, block_size, kv_heads, head_dim) tensor per layer and bind it."""
        shape = self.kv_cache_shape(num_blocks)
        self.kv_caches = [torch.zeros(shape, dtype=self.cfg.kv_cache_dtype, device=self.device) for _ in self.attention_layers]
        for layer, cache in zip(self.attention_layers, self.kv_caches):
            layer.kv_cache = cache

    @property
    def cuda_graphs_enabled(self) -> bool:
        """Graphs need CUDA and a backend with no host work per step (Triton); never on the CPU."""
        return self.cfg.compilation.cudagraph and self.device.type == "cuda" and self.attn_backend.name == "triton"

    def capture_cuda_graphs(self) -> None:
        """Capture decode steps after the KV cache exists (no-op where graphs are off)."""
        if not self.cuda_graphs_enabled:
            return
        sizes = [s for s in self.cfg.compilation.cudagraph_capture_sizes if s <= self.cfg.scheduler.max_num_seqs]
        if not sizes:
            return
        max_len = min(self.cfg.max_model_len, self.cfg.compilation.max_seq_len_to_capture)
        self.cuda_graphs = CUDAGraphRunner(self.model, sizes, cdiv(max_len, self.block_size), max_len, self.device)
        self.cuda_graphs.capture()

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Replay a captured graph for decode-only steps that fit one; run eagerly otherwise."""
        graphs = self.cuda_graphs
        if graphs is not None and meta.max_query_len == 1 and graphs.covers(meta):
            return graphs.run(input_ids, positions, meta)
        return self.model(input_ids, positions, meta)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at the full token budget on a throw-away cache, so the
        caller can measure peak activation memory."""
        start = time.perf_counter()
        budget = self.cfg.scheduler.max_num_batched_tokens
        num_seqs = max(1, min(self.cfg.scheduler.max_num_seqs, cdiv(budget, self.cfg.max_model_len)))
        lens = [budget // num_seqs + (1 if i < budget % num_seqs else 0) for i in range(num_seqs)]
        blocks_per_seq = [cdiv(n, self.block_size) for n in lens]
        self.init_kv_cache(sum(blocks_per_seq))
        tables, next_block = [], 0
        for nb in blocks_per_seq:
            tables.append(list(range(next_block, next_block + nb)))
            next_block += nb
        ids = np.zeros(budget, dtype=np.int64)
        positions = np.concatenate([np.arange(n) for n in lens])
        meta = self._attention_metadata(lens, [0] * num_seqs, tables, positions)
        hidden = self.model(torch.from_numpy(ids).to(self.device), torch.from_numpy(positions).to(self.device), meta)
        self.model.compute_logits(hidden[-num_seqs:])
        self.kv_caches = []
        for layer in self.attention_layers:
            layer.kv_cache = None
        if self.cfg.compilation.torch_compile:
            logger.info("Profile run with torch.compile of the small ops: %.1f s", time.perf_counter() - start)

    # ---- one step -----------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        req_ids = list(sched.num_scheduled_tokens)
        states = [self.requests[r] for r in req_ids]
        query_lens = [sched.num_scheduled_tokens[r] for r in req_ids]
        computed = [s.num_computed_tokens for s in states]
        input_ids, positions = self._flat_tokens(states, query_lens)
        meta = self._attention_metadata(query_lens, computed, [s.block_ids for s in states], positions)
        hidden = self._forward(input_ids, torch.from_numpy(positions).to(self.device), meta)  # (T, hidden)
        if any(s.prompt_logprobs is not None for s in states):
            starts = np.cumsum([0, *query_lens[:-1]]).tolist()
            add_prompt_logprobs(self.model.compute_logits, hidden, starts, states, computed, query_lens)
        sample_rows = [i for i, s in enumerate(states) if computed[i] + query_lens[i] == len(s.token_ids)]
        for state, n in zip(states, query_lens):
            state.num_computed_tokens += n
        if self.pooler is not None:  # runner=pooling: pooled hidden states instead of tokens
            return self.pooler(hidden, req_ids, computed, query_lens, sample_rows, sched.finished_req_ids)
        if not sample_rows:
            return ModelRunnerOutput()
        last_token = meta.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last_token[sample_rows]])  # (N, vocab) fp32
        sampled = self._sample(logits, [states[i] for i in sample_rows])
        return self._to_output([req_ids[i] for i in sample_rows], sampled)

    def _update_states(self, sched: SchedulerOutput) -> None:
        for req_id in sched.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in sched.new_reqs:
            self.requests[new.req_id] = CachedRequestState.from_new(new, self.device)
        for delta in sched.cached_reqs:
            state = self.requests[delta.req_id]
            state.token_ids.extend(delta.new_token_ids)
            state.block_ids.extend(delta.new_block_ids)
            state.num_computed_tokens = delta.num_computed_tokens

    def _flat_tokens(self, states: list[CachedRequestState], query_lens: list[int]) -> tuple[torch.Tensor, np.ndarray]:
        ids: list[int] = []
        pos_parts = []
        for state, n in zip(states, query_lens):
            start = state.num_computed_tokens
            ids.extend(state.token_ids[start : start + n])
            pos_parts.append(np.arange(start, start + n))
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)  # (T,)
        return input_ids, np.concatenate(pos_parts)  # (T,)

    def _attention_metadata(
        self, query_lens: list[int], computed: list[int], tables: list[list[int]], positions: np.ndarray
    ) -> AttentionMetadata:
        seq_lens = [c + n for c, n in zip(computed, query_lens)]
        max_blocks = max(len(t) for t in tables)
        table_arr = np.zeros((len(tables), max_blocks), dtype=np.int32)  # (B, max_blocks)
        for i, t in enumerate(tables):
            table_arr[i, : len(t)] = t
        req_index = np.repeat(np.arange(len(tables)), query_lens)  # (T,) request of each token
        slots = table_arr[req_index, positions // self.block_size].astype(np.int64) * self.block_size
        slots += positions % self.block_size
        query_start = np.zeros(len(query_lens) + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start[1:])
        to_dev = lambda a: torch.from_numpy(a).to(self.device, non_blocking=True)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=to_dev(slots),
            query_start_loc=to_dev(query_start),
            seq_lens=to_dev(np.asarray(seq_lens, dtype=np.int32)),
            block_tables=to_dev(table_arr),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=seq_lens,
        )
        meta.backend_data = self.attn_backend.prepare(meta, self.block_size)
        return meta

    def _sample(self, logits: torch.Tensor, states: list[CachedRequestState]) -> SamplerOutput:
        generators = {i: g for i, s in enumerate(states) if (g := s.seeded_generator()) is not None}
        meta = SamplingMetadata.build(
            [s.sampling_params for s in states],
            generators,
            logits.shape[-1],
            self.device,
            token_ids=[s.token_ids for s in states],
            num_prompt_tokens=[s.num_prompt_tokens for s in states],
        )
        return self.sampler(logits, meta)

    def _to_output(self, req_ids: list[RequestId], sampled: SamplerOutput) -> ModelRunnerOutput:
        tokens = sampled.token_ids.tolist()
        out = ModelRunnerOutput(sampled_token_ids={r: [t] for r, t in zip(req_ids, tokens)})
        for req_id in req_ids:
            state = self.requests[req_id]
            if state.prompt_logprobs is not None:  # complete now: the prompt is all computed
                out.prompt_logprobs[req_id], state.prompt_logprobs = state.prompt_logprobs, None
        if sampled.logprobs is None:
            return out
        values, ids = sampled.logprobs.tolist(), sampled.logprob_token_ids.tolist()
        for row, req_id in enumerate(req_ids):
            asked = self.requests[req_id].sampling_params.logprobs
            if asked is not None:
                pairs = zip(ids[row][: 1 + asked], values[row][: 1 + asked])
                out.logprobs[req_id] = [dict(pairs)]
        return out

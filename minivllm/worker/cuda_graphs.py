"""Decode-only steps replayed from captured CUDA graphs.

A decode step launches hundreds of small kernels; on a fast GPU the launches,
not the math, bound it. Capturing the model's forward once per batch size and
replaying the graph removes that overhead.

Graphs are captured for ``compilation.cudagraph_capture_sizes`` (capped at
``scheduler.max_num_seqs``) after the KV cache is allocated, largest first, all
sharing one memory pool. A decode step of ``B`` requests replays the smallest
captured size ``N >= B``; rows ``B .. N-1`` are padding::

    slot_mapping  -1   (the KV write skips them)
    seq_lens       1   (attend to one key: block 0, slot 0; the result is discarded)
    block_tables   0

Every input lives in a static buffer the graph reads; ``run`` copies the step's
values in, replays, and returns a view of the static output. Only the Triton
backend is captured: the torch backend builds its gather indices on the host.

With the fused sampler (``compilation.fused_sampler``) the graphs also hold the
logits and the sampler (``compute_logits`` given): each replay computes the rows'
tokens from three more static inputs, the rows' temperatures and Philox keys and
offsets (``Sampler.philox_inputs``), so a plain decode step is one replay
(``run_sampled``). A step the runner samples itself (logit edits, logprobs, a
grammar, min-p / top-k / top-p) replays the same graph and ignores its tokens;
padding rows sample from stale inputs, and their tokens are dropped. The graphs'
pool then holds one (largest size, vocab) logits tensor of the model's dtype.
"""

from __future__ import annotations

import bisect
from typing import Callable

import torch
from torch import nn

from minivllm.attention.backend import AttentionMetadata
from minivllm.sample.triton_sampler import fused_sample


class CUDAGraphRunner:
    def __init__(
        self,
        model: nn.Module,
        sizes: list[int],
        max_blocks_per_seq: int,
        max_model_len: int,
        device: torch.device,
        compute_logits: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.model = model
        self.compute_logits = compute_logits
        """The model's logits, captured with the fused sampler; None: the graphs end at the hidden states."""
        self.vocab_size: int | None = None
        """The logits' width, known after ``capture`` when the graphs sample."""
        self.sizes = sorted(set(sizes))
        self.max_model_len = max_model_len
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # one query per request
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if compute_logits is not None:  # the fused sampler's inputs and output
            self.temperature = torch.zeros(n, dtype=torch.float32, device=device)
            self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
            self.offsets = torch.zeros(n, dtype=torch.int64, device=device)
            self.tokens = torch.zeros(n, dtype=torch.int64, device=device)

    def covers(self, meta: AttentionMetadata) -> bool:
        """A decode step fits a captured graph: a captured batch size and no sequence longer than
        the graphs' block tables (``compilation.max_seq_len_to_capture``; a step's block-table
        width follows its longest sequence)."""
        return meta.max_seq_len <= self.max_model_len and self.padded_size(meta.num_reqs) is not None

    def _meta(self, n: int) -> AttentionMetadata:
        """Metadata over the first ``n`` rows of the static buffers. ``max_seq_len`` is
        the model's limit so the kernel's launch grid is the same at every replay."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:n],
            query_start_loc=self.query_start_loc[: n + 1],
            seq_lens=self.seq_lens[:n],
            block_tables=self.block_tables[:n],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_lens_cpu=[1] * n,
            seq_lens_cpu=[self.max_model_len] * n,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for n in reversed(self.sizes):
            self.step(n)  # warm-up: kernels compiled outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[n] = self.step(n)
            pool = graph.pool()
            self.graphs[n] = graph

    def step(self, n: int) -> torch.Tensor:
        """What a graph of ``n`` rows runs: the model over the static buffers, then (when the graphs
        sample) the logits and the fused sampler into ``tokens``. Returns the (n, hidden) states."""
        hidden = self.model(self.input_ids[:n], self.positions[:n], self._meta(n))
        if self.compute_logits is not None:
            logits = self.compute_logits(hidden)  # (n, vocab)
            self.vocab_size = logits.shape[-1]
            fused_sample(logits, self.temperature[:n], self.seeds[:n], self.offsets[:n], out=self.tokens[:n])
        return hidden

    def padded_size(self, num_reqs: int) -> int | None:
        """The captured size a decode step of ``num_reqs`` requests runs at; None above the largest."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Replay for a decode-only step (``meta.max_query_len == 1``): (B, hidden) hidden states."""
        b, n = meta.num_reqs, self.padded_size(meta.num_reqs)
        width = meta.block_tables.shape[1]
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slot_mapping[:b].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[b:n].fill_(-1)
        self.seq_lens[:b].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[b:n].fill_(1)
        self.block_tables[:n].zero_()
        self.block_tables[:b, :width].copy_(meta.block_tables, non_blocking=True)
        self.graphs[n].replay()
        return self.outputs[n][:b]

    def run_sampled(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        """Replay a decode step and its sampling (graphs captured with ``compute_logits``): (B,) int64
        the rows' tokens, a view of the static output that the next replay overwrites.
        ``temperature``, ``seeds``, ``offsets``: (B,) the fused sampler's inputs."""
        b = meta.num_reqs
        self.temperature[:b].copy_(temperature, non_blocking=True)
        self.seeds[:b].copy_(seeds, non_blocking=True)
        self.offsets[:b].copy_(offsets, non_blocking=True)
        self.run(input_ids, positions, meta)
        return self.tokens[:b]

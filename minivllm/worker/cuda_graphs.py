"""Decode-only steps replayed from captured CUDA graphs.

A decode step launches hundreds of small kernels; on a fast GPU the launches,
not the math, bound it. Capturing the model's forward once per batch size and
replaying the graph removes that overhead.

Graphs are captured for ``compilation.cudagraph_capture_sizes`` (capped at
``scheduler.max_num_seqs``; by default 1, 2, 4 and every multiple of 8, see
``config.device.capture_sizes``) after the KV cache is allocated, largest first, all
sharing one memory pool. A decode step of ``B`` requests replays the smallest
captured size ``N >= B``; rows ``B .. N-1`` are padding::

    slot_mapping  -1   (the KV write skips them)
    seq_lens       1   (attend to one key: block 0, slot 0; the result is discarded)
    block_tables   0

Every input lives in a static buffer the graph reads; ``run`` copies the step's
values in, replays, and returns a view of the static output. Only the Triton
backend is captured: the torch backend builds its gather indices on the host.
"""

from __future__ import annotations

import bisect
import time

import torch
from torch import nn

from minivllm.attention.backend import AttentionMetadata


class CUDAGraphRunner:
    def __init__(
        self, model: nn.Module, sizes: list[int], max_blocks_per_seq: int, max_model_len: int, device: torch.device
    ) -> None:
        self.model = model
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
        self.capture_s = 0.0
        """Seconds ``capture`` took (start-up log, ``benchmarks/profile_decode.py``)."""
        self.memory_bytes = 0
        """Device memory the captured graphs hold (their pool and static outputs)."""

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
        """Capture every size, largest first, into one pool; records ``capture_s`` (wall seconds,
        warm-ups included) and ``memory_bytes`` (device memory the capture kept allocated: the
        graphs' pool and outputs)."""
        torch.cuda.synchronize()
        start, before = time.perf_counter(), torch.cuda.memory_allocated()
        pool = None
        for n in reversed(self.sizes):
            meta = self._meta(n)
            self.model(self.input_ids[:n], self.positions[:n], meta)  # warm-up: kernels compiled outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[n] = self.model(self.input_ids[:n], self.positions[:n], meta)
            pool = graph.pool()
            self.graphs[n] = graph
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - start
        self.memory_bytes = torch.cuda.memory_allocated() - before

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

"""Decode-only steps replayed from captured CUDA graphs.

A decode step launches hundreds of small kernels; on a fast GPU the launches,
not the math, bound it. Capturing the model's forward once per batch size and
replaying the graph removes that overhead.

Graphs are captured for ``compilation.cudagraph_capture_sizes`` (capped at
``scheduler.max_num_seqs``; by default 1, 2, 4 and every multiple of 8, see
``config.device.capture_sizes``) after the KV cache is allocated, largest first, all
sharing one memory pool. A decode step of ``B`` requests replays the smallest
captured size ``N >= B`` (the short-context graph of that size, when there is one and
every sequence is under ``SPLIT_MIN_CONTEXT``); rows ``B .. N-1`` are padding::

    slot_mapping  -1   (the KV write skips them)
    seq_lens       1   (attend to one key: block 0, slot 0; the result is discarded)
    block_tables   0
    state_indices -1   (hybrid models: the Triton state kernels skip the row)
    has_initial_state  False

Every input lives in a static buffer the graph reads; ``run`` copies the step's
values in, replays, and returns a view of the static output. On CUDA the copies
and the padding are one launch (``_stage_inputs_kernel``, one program per
captured row) instead of eight copy/fill kernels; the torch code in
``_stage_torch`` is the reference and the CPU path. Only the Triton backend is
captured: the torch backend builds its gather indices on the host.

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
import time
from dataclasses import replace
from typing import Callable

import torch
import triton
import triton.language as tl
from torch import nn

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.ops.checks import check_launchable, check_tensor, is_interpreted, require
from minivllm.attention.ops.paged_attention_tiles import SPLIT_MIN_CONTEXT
from minivllm.sample.triton_sampler import fused_sample

MAX_BLOCK_W = 1024  # block-table entries one program writes per loop step


@triton.jit
def _stage_inputs_kernel(
    src_ids_ptr,  # (B,) a decode step's inputs, one row per request
    src_pos_ptr,  # (B,)
    src_slots_ptr,  # (B,)
    src_lens_ptr,  # (B,)
    src_tables_ptr,  # (B, W)
    src_state_idx_ptr,  # (B,) hybrid models' state slots (read when HAS_STATES)
    src_has_init_ptr,  # (B,) bool
    dst_ids_ptr,  # (N,) the graph's static buffers, N >= B rows
    dst_pos_ptr,  # (N,)
    dst_slots_ptr,  # (N,)
    dst_lens_ptr,  # (N,)
    dst_tables_ptr,  # (N, DST_W)
    dst_state_idx_ptr,  # (N,)
    dst_has_init_ptr,  # (N,)
    num_reqs,
    src_width,
    stride_src_table,
    stride_dst_table,
    DST_W: tl.constexpr,
    BLOCK_W: tl.constexpr,
    HAS_STATES: tl.constexpr,
):
    """One program per captured row: a request's values, or the padding (slot -1, length 1,
    block table 0; state slot -1, no initial state) for rows ``B .. N-1``; block-table entries
    past ``W`` are zeroed."""
    row = tl.program_id(0)
    live = row < num_reqs
    src_row = tl.minimum(row, num_reqs - 1).to(tl.int64)  # padding rows read (and drop) the last request
    ids = tl.load(src_ids_ptr + src_row)
    pos = tl.load(src_pos_ptr + src_row)
    slot = tl.load(src_slots_ptr + src_row)
    seq_len = tl.load(src_lens_ptr + src_row)
    tl.store(dst_ids_ptr + row, tl.where(live, ids, 0).to(dst_ids_ptr.dtype.element_ty))
    tl.store(dst_pos_ptr + row, tl.where(live, pos, 0).to(dst_pos_ptr.dtype.element_ty))
    tl.store(dst_slots_ptr + row, tl.where(live, slot, -1).to(dst_slots_ptr.dtype.element_ty))
    tl.store(dst_lens_ptr + row, tl.where(live, seq_len, 1).to(dst_lens_ptr.dtype.element_ty))
    if HAS_STATES:
        state_idx = tl.load(src_state_idx_ptr + src_row)
        has_init = tl.load(src_has_init_ptr + src_row).to(tl.int32)
        tl.store(dst_state_idx_ptr + row, tl.where(live, state_idx, -1).to(dst_state_idx_ptr.dtype.element_ty))
        tl.store(dst_has_init_ptr + row, (tl.where(live, has_init, 0) != 0).to(dst_has_init_ptr.dtype.element_ty))
    row64 = row.to(tl.int64)
    width = tl.where(live, src_width, 0)  # padding rows copy no entries
    for start in range(0, DST_W, BLOCK_W):
        cols = start + tl.arange(0, BLOCK_W)
        entries = tl.load(src_tables_ptr + src_row * stride_src_table + cols, mask=cols < width, other=0)
        tl.store(
            dst_tables_ptr + row64 * stride_dst_table + cols,
            entries.to(dst_tables_ptr.dtype.element_ty),
            mask=cols < DST_W,
        )


def stage_launch_constexprs(dst_width: int, has_states: bool = False) -> dict:
    """The staging kernel's compile-time arguments for block tables ``dst_width`` entries wide,
    with hybrid models' state slots or not (also read by ``tools/kernel_report.py``)."""
    return dict(DST_W=dst_width, BLOCK_W=min(MAX_BLOCK_W, triton.next_power_of_2(dst_width)), HAS_STATES=has_states)


class CUDAGraphRunner:
    def __init__(
        self,
        model: nn.Module,
        sizes: list[int],
        max_blocks_per_seq: int,
        max_model_len: int,
        device: torch.device,
        short_sizes: list[int] | None = None,
        compute_logits: Callable[[torch.Tensor], torch.Tensor] | None = None,
        states: bool = False,
    ) -> None:
        """``short_sizes`` (a subset of ``sizes``) are captured a second time for steps whose
        sequences are all shorter than ``SPLIT_MIN_CONTEXT``: the attention kernel's split count
        follows the graph's ``max_seq_len``, so there it is one launch with no combine pass.
        ``states``: the model has linear-attention layers (hybrid models), whose state slots and
        continuation flags (``AttentionMetadata.state_indices``, ``has_initial_state``) are staged
        too; padding rows get slot -1, which the Triton state kernels skip."""
        self.model = model
        self.compute_logits = compute_logits
        """The model's logits, captured with the fused sampler; None: the graphs end at the hidden states."""
        self.vocab_size: int | None = None
        """The logits' width, known after ``capture`` when the graphs sample."""
        self.sizes = sorted(set(sizes))
        self.max_model_len = max_model_len
        self.short_len = min(max_model_len, SPLIT_MIN_CONTEXT - 1)
        """The ``max_seq_len`` the short-context graphs are captured at."""
        short = set(short_sizes or ()) & set(self.sizes)
        self.short_sizes = sorted(short) if self.short_len < max_model_len else []
        self.short_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.short_outputs: dict[int, torch.Tensor] = {}
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # one query per request
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.state_indices: torch.Tensor | None = None  # (n,) int32, hybrid models only
        self.has_initial_state: torch.Tensor | None = None  # (n,) bool
        if states:
            self.state_indices = torch.full((n,), -1, dtype=torch.int32, device=device)
            self.has_initial_state = torch.zeros(n, dtype=torch.bool, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.fused_staging = device.type == "cuda"
        """Stage a step's inputs with ``_stage_inputs_kernel`` (CUDA) instead of the torch copies."""
        self._stage_constexprs = stage_launch_constexprs(max_blocks_per_seq, states)
        self.capture_s = 0.0
        """Seconds ``capture`` took (start-up log, ``benchmarks/profile_decode.py``)."""
        self.memory_bytes = 0
        """Device memory the captured graphs hold (their pool and static outputs)."""
        if compute_logits is not None:  # the fused sampler's inputs and output
            self.temperature = torch.zeros(n, dtype=torch.float32, device=device)
            self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
            self.offsets = torch.zeros(n, dtype=torch.int64, device=device)
            self.tokens = torch.zeros(n, dtype=torch.int64, device=device)

    def covers(self, meta: AttentionMetadata) -> bool:
        """A decode step fits a captured graph: a captured batch size and no sequence longer than
        the graphs' block tables (``compilation.max_seq_len_to_capture``). A step's block tables may
        be wider than its longest sequence needs (slots allocated ahead: multi-step decoding,
        lookahead); ``run`` stages only the columns the graphs hold, all a covered step reads."""
        return meta.max_seq_len <= self.max_model_len and self.padded_size(meta.num_reqs) is not None

    def _meta(self, n: int, max_seq_len: int | None = None) -> AttentionMetadata:
        """Metadata over the first ``n`` rows of the static buffers. ``max_seq_len`` is
        the model's limit (or ``short_len``) so the kernel's launch grid is the same at every replay."""
        max_seq_len = self.max_model_len if max_seq_len is None else max_seq_len
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:n],
            query_start_loc=self.query_start_loc[: n + 1],
            seq_lens=self.seq_lens[:n],
            block_tables=self.block_tables[:n],
            max_query_len=1,
            max_seq_len=max_seq_len,
            query_lens_cpu=[1] * n,
            seq_lens_cpu=[max_seq_len] * n,
            state_indices=self.state_indices[:n] if self.state_indices is not None else None,
            has_initial_state=self.has_initial_state[:n] if self.has_initial_state is not None else None,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, into one pool; records ``capture_s`` (wall seconds,
        warm-ups included) and ``memory_bytes`` (device memory the capture kept allocated: the
        graphs' pool and outputs)."""
        torch.cuda.synchronize()
        start, before = time.perf_counter(), torch.cuda.memory_allocated()
        pool = None
        captures = [(n, self.max_model_len, self.graphs, self.outputs) for n in reversed(self.sizes)]
        captures += [(n, self.short_len, self.short_graphs, self.short_outputs) for n in reversed(self.short_sizes)]
        for n, max_seq_len, graphs, outputs in captures:
            self.step(n, max_seq_len)  # warm-up: kernels compiled outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs[n] = self.step(n, max_seq_len)
            pool = graph.pool()
            graphs[n] = graph
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - start
        self.memory_bytes = torch.cuda.memory_allocated() - before

    def step(self, n: int, max_seq_len: int | None = None) -> torch.Tensor:
        """What a graph of ``n`` rows runs: the model over the static buffers (attention launched for
        ``max_seq_len``, the model's limit by default), then (when the graphs sample) the logits and the
        fused sampler into ``tokens``. Returns the (n, hidden) states."""
        hidden = self.model(self.input_ids[:n], self.positions[:n], self._meta(n, max_seq_len))
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
        width = self.block_tables.shape[1]
        if meta.block_tables.shape[1] > width:  # blocks past max_seq_len (``covers``): nothing reads them
            meta = replace(meta, block_tables=meta.block_tables[:, :width])
        if self.fused_staging:
            self._stage_fused(input_ids, positions, meta, n)
        else:
            self._stage_torch(input_ids, positions, meta, n)
        if meta.max_seq_len <= self.short_len and n in self.short_graphs:
            self.short_graphs[n].replay()
            return self.short_outputs[n][:b]
        self.graphs[n].replay()
        return self.outputs[n][:b]

    def _stage_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, n: int) -> None:
        """``_stage_torch`` in one launch. Checks shapes, dtypes and strides (never values: that
        would synchronize); a step that passes costs a few comparisons, the messages are built
        only for one that does not."""
        b, tables = meta.num_reqs, meta.block_tables
        if not self._stageable(input_ids, positions, meta, n):
            self._check_staging(input_ids, positions, meta, n)
        states = self.state_indices is not None  # else the state pointers are dummies, never read
        _stage_inputs_kernel[(n,)](
            input_ids,
            positions,
            meta.slot_mapping,
            meta.seq_lens,
            tables,
            meta.state_indices if states else meta.seq_lens,
            meta.has_initial_state if states else meta.seq_lens,
            self.input_ids,
            self.positions,
            self.slot_mapping,
            self.seq_lens,
            self.block_tables,
            self.state_indices if states else self.seq_lens,
            self.has_initial_state if states else self.seq_lens,
            b,
            tables.shape[1],
            tables.stride(0),
            self.block_tables.stride(0),
            **self._stage_constexprs,
        )

    def _stageable(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, n: int) -> bool:
        """The few comparisons ``_stage_fused`` makes per step; ``_check_staging`` says what failed."""
        b, device, tables = meta.num_reqs, self.input_ids.device, meta.block_tables
        vectors = (input_ids, positions, meta.slot_mapping, meta.seq_lens)
        if self.state_indices is not None:
            if meta.state_indices is None or meta.has_initial_state is None:
                return False
            vectors += (meta.state_indices, meta.has_initial_state)
        return (
            (device.type == "cuda" or is_interpreted(_stage_inputs_kernel))
            and 1 <= b <= n <= self.sizes[-1]
            and all(t.device == device and t.dim() == 1 and t.shape[0] == b and t.stride(0) == 1 for t in vectors)
            and not any(t.is_floating_point() for t in vectors)
            and tables.device == device
            and tables.dim() == 2
            and tables.shape[0] == b
            and tables.shape[1] <= self.block_tables.shape[1]
            and tables.stride(1) == 1
        )

    def _check_staging(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, n: int) -> None:
        """The ValueError for inputs ``_stageable`` refused, naming what is wrong."""
        device, b = self.input_ids.device, meta.num_reqs
        check_launchable(device, _stage_inputs_kernel)
        vectors = (("input_ids", input_ids), ("positions", positions), ("slot_mapping", meta.slot_mapping))
        if self.state_indices is not None:
            require(meta.state_indices is not None, "a hybrid model's step needs state_indices and has_initial_state")
            vectors += (("state_indices", meta.state_indices), ("has_initial_state", meta.has_initial_state))
        for name, t in (*vectors, ("seq_lens", meta.seq_lens)):
            check_tensor(t, name, device, dims=1)
            require(t.shape[0] == b and not t.is_floating_point(), f"{name} must be ({b},) integers, got {t.dtype}")
        check_tensor(meta.block_tables, "block_tables", device, dims=2)
        dst_width = self.block_tables.shape[1]
        require(
            meta.block_tables.shape[0] == b and meta.block_tables.shape[1] <= dst_width,
            f"block_tables ({b}, <= {dst_width}) expected, got {tuple(meta.block_tables.shape)}",
        )
        require(1 <= b <= n <= self.sizes[-1], f"{b} requests do not fit {n} captured rows")
        raise ValueError(f"unit strides expected, got {[t.stride() for _, t in vectors]}")

    def _stage_torch(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, n: int) -> None:
        """The step's values into rows ``0 .. B-1`` of the static buffers, padding into ``B .. n-1``."""
        b, width = meta.num_reqs, meta.block_tables.shape[1]
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slot_mapping[:b].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[b:n].fill_(-1)
        self.seq_lens[:b].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[b:n].fill_(1)
        self.block_tables[:n].zero_()
        self.block_tables[:b, :width].copy_(meta.block_tables, non_blocking=True)
        if self.state_indices is not None:
            self.state_indices[:b].copy_(meta.state_indices, non_blocking=True)
            self.state_indices[b:n].fill_(-1)
            self.has_initial_state[:b].copy_(meta.has_initial_state, non_blocking=True)
            self.has_initial_state[b:n].fill_(False)

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

"""The fused sampler: one pass over each row of logits picks its token.

Each row of (N, V) logits, read in their dtype, is walked once, ``BLOCK`` entries at a time, by
one program (a large vocabulary) or with other rows by one program (a small one, ``ROWS`` rows):

- greedy rows (temperature 0) keep the running maximum: the first largest entry, as
  ``torch.argmax`` picks it (a NaN entry is passed over, where torch would pick it);
- random rows keep the running maximum of ``x / T + g`` with ``g = -log(-log u)`` Gumbel noise,
  ``u`` uniform in (0, 1): the Gumbel-max race, the log of the torch path's exponential race
  ``argmax(p / q)`` (``q = -log u ~ Exp(1)``, ``log p = x / T - log Z``), so it draws from the same
  softmax with no softmax, no normalisation and no (N, V) noise tensor.

The noise is Philox-4x32 keyed by the row's ``seed`` with the counter ``(column, offset lo,
offset hi, 0)``, so a row's draws depend only on its (seed, offset) pair and never on the batch
it rides in. The sampler gives each row its pair (``Sampler._philox_inputs``): a seeded request
its own key, made from its seed and the output position it samples (its generator's
``initial_seed``), with offset 0; every other row the engine generator's seed, with an offset
made of the step's count and the row's index (never 0).

Rows that ask for top-k, top-p or min-p come in processed (``masked``, a (F, V) fp32 tensor:
temperature applied, cut tokens -inf, made by the torch ops for those F rows alone) and
``masked_rows[r]`` names a row's entry there (-1: none); their temperature reads 1 here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require

MAX_BLOCK = 2048  # entries a program holds at once; a 151,936-token vocabulary takes 75 blocks of a row
NUM_WARPS = 8  # 8 entries a thread: ~60 registers (tools/kernel_report.py), no spills
MAX_ROWS = 64  # rows a program takes at once when the vocabulary is small


@triton.jit
def _fused_sample_kernel(
    logits_ptr,  # (N, V) fp32 / fp16 / bf16
    masked_ptr,  # (F, V) fp32: rows processed for top-k / top-p / min-p (read when HAS_MASKED)
    masked_rows_ptr,  # (N,) int32: the row's entry in masked, -1 for none (read when HAS_MASKED)
    temperature_ptr,  # (N,) fp32: 0 greedy
    seed_ptr,  # (N,) int64: Philox key
    offset_ptr,  # (N,) int64: Philox counter words 1 and 2
    out_ptr,  # (N,) int64
    num_rows,
    vocab_size,
    stride_l,
    stride_m,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_MASKED: tl.constexpr,
):
    """One program per ``ROWS`` rows (1 for a large vocabulary), ``BLOCK`` columns at a time."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (R,)
    live = rows < num_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK)
    temp = tl.load(temperature_ptr + rows, mask=live, other=0.0)
    greedy = temp == 0.0
    seed = tl.load(seed_ptr + rows, mask=live, other=0)
    offset = tl.load(offset_ptr + rows, mask=live, other=0)
    zero = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
    offset_lo = zero + (offset & 0xFFFFFFFF).to(tl.uint32)[:, None]
    offset_hi = zero + ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)[:, None]
    seed2 = seed[:, None] + tl.zeros([ROWS, BLOCK], dtype=tl.int64)
    use_masked = tl.zeros([ROWS], dtype=tl.int1)
    masked_row = tl.zeros([ROWS], dtype=tl.int64)
    if HAS_MASKED:
        masked_row = tl.load(masked_rows_ptr + rows, mask=live, other=-1).to(tl.int64)
        use_masked = masked_row >= 0
    scale = tl.where(greedy | use_masked, 1.0, temp)[:, None]
    any_random = tl.max((~greedy & live).to(tl.int32), axis=0) > 0
    best = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([ROWS, BLOCK], dtype=tl.int32)
    for start in range(0, vocab_size, BLOCK):
        idx = start + cols
        inside = live[:, None] & (idx < vocab_size)[None, :]
        plain = inside & ~use_masked[:, None]
        x = tl.load(logits_ptr + rows64[:, None] * stride_l + idx[None, :], mask=plain, other=float("-inf"))
        x = x.to(tl.float32)
        if HAS_MASKED:
            from_masked = inside & use_masked[:, None]
            y = tl.load(masked_ptr + masked_row[:, None] * stride_m + idx[None, :], mask=from_masked, other=0.0)
            x = tl.where(from_masked, y, x)
        if any_random:  # a program of greedy rows draws no noise
            r, _, _, _ = tl.philox(seed2, zero + idx.to(tl.uint32)[None, :], offset_lo, offset_hi, zero)
            u = ((r >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)  # 24 bits: uniform in (0, 1), never 0 or 1
            x = tl.where(greedy[:, None], x, x / scale - tl.log(-tl.log(u)))
        better = x > best  # strictly: an earlier column keeps a tie
        best = tl.where(better, x, best)
        best_idx = tl.where(better, idx[None, :], best_idx)
    top = tl.max(best, axis=1)  # (R,)
    first = tl.min(tl.where(best == top[:, None], best_idx, vocab_size), axis=1)
    tl.store(out_ptr + rows, tl.minimum(first, vocab_size - 1).to(tl.int64), mask=live)  # all -inf: column 0


def fused_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    masked: torch.Tensor | None = None,
    masked_rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) int64 a token per row of ``logits`` (N, V): greedy where ``temperature`` (N,) fp32 is 0,
    else drawn from ``softmax(logits / temperature)`` with the Philox noise of ``seeds`` and
    ``offsets`` (N,) int64. ``masked`` (F, V) fp32 and ``masked_rows`` (N,) int32: the processed
    rows of those asking for top-k / top-p / min-p (module docstring). ``out``: (N,) int64 to write."""
    device = logits.device
    check_launchable(device, _fused_sample_kernel)
    check_tensor(logits, "logits", device, dims=2)
    require(logits.dtype in SUPPORTED_DTYPES, f"logits dtype must be one of {SUPPORTED_DTYPES}, got {logits.dtype}")
    n, vocab_size = logits.shape
    for name, t, dtype in (("temperature", temperature, torch.float32), ("seeds", seeds, torch.int64)):
        check_tensor(t, name, device, dims=1)
        require(t.shape[0] == n and t.dtype == dtype, f"{name} must be ({n},) {dtype}, got {tuple(t.shape)} {t.dtype}")
    check_tensor(offsets, "offsets", device, dims=1)
    require(offsets.shape == (n,) and offsets.dtype == torch.int64, f"offsets must be ({n},) int64")
    require((masked is None) == (masked_rows is None), "masked and masked_rows come together")
    if masked is not None:
        check_tensor(masked, "masked", device, dims=2)
        require(
            masked.shape[1] == vocab_size and masked.dtype == torch.float32,
            f"masked must be (F, {vocab_size}) fp32, got {tuple(masked.shape)} {masked.dtype}",
        )
        check_tensor(masked_rows, "masked_rows", device, dims=1)
        require(masked_rows.shape == (n,) and masked_rows.dtype == torch.int32, f"masked_rows must be ({n},) int32")
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=device)
    require(out.shape == (n,) and out.dtype == torch.int64 and out.device == device, f"out must be ({n},) int64")
    if n == 0:
        return out
    constexprs = launch_constexprs(vocab_size, masked is not None)
    _fused_sample_kernel[(triton.cdiv(n, constexprs["ROWS"]),)](
        logits,
        masked if masked is not None else logits,
        masked_rows if masked_rows is not None else temperature,
        temperature,
        seeds,
        offsets,
        out,
        n,
        vocab_size,
        logits.stride(0),
        masked.stride(0) if masked is not None else 0,
        **constexprs,
        num_warps=NUM_WARPS,
    )
    return out


def launch_constexprs(vocab_size: int, has_masked: bool) -> dict:
    """The kernel's compile-time arguments (also read by ``tools/kernel_variants.py``): a block of
    at most ``MAX_BLOCK`` columns, and as many rows to a program as fill it (at most ``MAX_ROWS``)."""
    block = min(triton.next_power_of_2(vocab_size), MAX_BLOCK)
    return dict(ROWS=min(MAX_BLOCK // block, MAX_ROWS), BLOCK=block, HAS_MASKED=has_masked)

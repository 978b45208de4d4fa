"""How a paged-attention launch is cut up: the tiles of one program and the KV splits.

``tile_config`` gives (BLOCK_Q, BLOCK_N, num_warps) from the head size, the GQA group,
the longest query and the GPU's compute capability; ``default_num_splits`` the split-KV
factor of a decode batch from the multiprocessor count. Both are pure functions of their
arguments, so ``tools/kernel_report.py`` calls them with each target's numbers and
compiles exactly what a launch on that GPU would. The wrapper reads the device's
capability and multiprocessor count once per device (``tuned_tiles.device_facts``).
"""

from __future__ import annotations

import triton

MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 16
SPLIT_MIN_CONTEXT = 1024
"""Below this many keys a decode launch never splits (``default_num_splits``)."""


def tile_config(
    head_dim: int, group_pad: int, max_query_len: int, fp32: bool, capability: tuple[int, int] | None = None
) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_N, num_warps) for a GPU of compute ``capability`` (None: the CPU
    interpreter, which takes the Hopper tiles). A tile holds at least 16 rows (tl.dot's minimum).

    Sized so that programs do not spill registers (``python -m tools.kernel_report``
    compiles them for sm_80 and sm_90): fp32 products run on CUDA cores, not tensor cores,
    and need smaller tiles. The Hopper (sm_90) tiles were measured on an H200 (decode at
    94-100% of copy bandwidth). Before Hopper (sm_8x) ptxas needs more registers for the
    same tile, so prefill tiles at head_dim <= 128 and fp32 tiles at head_dim > 128 take
    half as many keys per step: a 64-row bf16/fp16 tile at BLOCK_N=64 there is 255
    registers and spills (188 at 32), an fp32 32-row tile at BLOCK_N=32 spills too (116
    registers at 16), and the 8-warp fp32 head_dim 256 tile spills at 32 (76 at 16)."""
    big, decode = head_dim > 128, max_query_len == 1
    if decode:
        rows = 16
    else:
        rows = (16 if big else 32) if fp32 else (32 if big else 64)
    block_n = 32 if big or fp32 else 64
    num_warps = 8 if big and (fp32 or not decode) else 4
    if capability is not None and capability < (9, 0) and ((fp32 and big) or (not big and not decode)):
        block_n //= 2
    return max(1, rows // group_pad), block_n, num_warps


def default_num_splits(num_sms: int, programs: int, max_query_len: int, max_seq_len: int) -> int:
    """KV splits for a batch from (batch, context, SMs): decode batches whose ``programs``
    (requests x KV heads) would not fill the ``num_sms`` multiprocessors twice over get more,
    each still >= ``MIN_KEYS_PER_SPLIT`` keys long.

    One split means one launch and no combine pass. That is the choice for prefill work, for
    batches that fill the GPU, and for contexts under ``SPLIT_MIN_CONTEXT`` keys: there one
    program reads its whole context (1024 keys of a 128-wide bf16 head are 0.5 MiB: a few
    microseconds at one multiprocessor's share of the bandwidth) in about the time the combine
    pass (a second launch, and partial results written and read back in fp32) would add, so
    splitting does not pay. A CUDA graph sees the graphs' longest context here; the runner
    captures its small batches a second time at a context under the threshold
    (``worker/cuda_graphs.py``), so a short single request replays one launch per layer."""
    if max_query_len != 1 or max_seq_len < SPLIT_MIN_CONTEXT:
        return 1
    wanted = triton.next_power_of_2(triton.cdiv(2 * num_sms, programs))
    affordable = 1 << (max(1, max_seq_len // MIN_KEYS_PER_SPLIT).bit_length() - 1)  # power of two, rounded down
    return min(wanted, affordable, MAX_SPLITS)

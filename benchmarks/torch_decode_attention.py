"""Decode attention of the torch backend on a mid-run batch, two ways, in one process.

    python benchmarks/torch_decode_attention.py [--batch 32] [--min-len 24] [--max-len 256]

1. slot gather, one call:   gather K/V slot by slot, pad every request to the longest
                            (the backend's decode path before whole-block gathers)
2. the backend:             whole-block gathers, one call per power-of-two block count,
                            indices built once per step by ``prepare`` (the current path)

Shapes are opt-125m's (12 heads of 64, fp32, block 16). Prints ms per layer call,
wall time and process CPU time (the latter is steadier on a shared machine): the
minimum over interleaved repeats (least disturbed by other load) and the median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import TorchAttentionBackend, _attend


def gather_slots(block_tables: torch.Tensor, max_len: int, block_size: int) -> torch.Tensor:
    """(B, max_blocks) block tables -> (B, max_len) cache slots of positions 0..max_len-1."""
    pos = torch.arange(max_len)
    return block_tables[:, pos // block_size].long() * block_size + pos % block_size


def _gather(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = kv_cache.view(2, -1, *kv_cache.shape[-2:])
    return flat[0][slots].transpose(1, 2), flat[1][slots].transpose(1, 2)


def slot_gather_one_call(query, kv_cache, meta, out, scale):
    seq_lens = meta.seq_lens.long()
    slots = gather_slots(meta.block_tables, meta.max_seq_len, kv_cache.shape[2])
    k, v = _gather(kv_cache, slots)
    mask = torch.arange(meta.max_seq_len) < seq_lens[:, None]
    out[:] = _attend(query.unsqueeze(2), k, v, mask[:, None, None, :], scale, None).squeeze(2)


def make_batch(batch: int, min_len: int, max_len: int, heads=12, head_dim=64, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(min_len, max_len + 1, (batch,), generator=gen).tolist()
    blocks = [-(-n // block_size) for n in seq_lens]
    kv_cache = torch.randn(2, sum(blocks) + 8, block_size, heads, head_dim, generator=gen)
    perm = torch.randperm(kv_cache.shape[1], generator=gen).tolist()
    tables, used = [], 0
    for nb in blocks:
        tables.append(perm[used : used + nb])
        used += nb
    width = max(blocks)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(
            [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, seq_lens)]
        ),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=max(seq_lens),
        query_lens_cpu=[1] * batch,
        seq_lens_cpu=seq_lens,
    )
    query = torch.randn(batch, heads, head_dim, generator=gen)
    return query, kv_cache, meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=24)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    query, kv_cache, meta = make_batch(args.batch, args.min_len, args.max_len)
    backend, scale = TorchAttentionBackend(), 0.125
    meta.slot_mapping = torch.full_like(meta.slot_mapping, -1)  # write nothing: time attention alone
    meta.backend_data = backend.prepare(meta, kv_cache.shape[2])  # once per step, shared by all layers
    new_kv = torch.zeros(args.batch, kv_cache.shape[3], kv_cache.shape[4])

    def backend_path(out):
        out[:] = backend.forward(query, new_kv, new_kv, kv_cache, meta, scale=scale)

    ways = {
        "slot gather, one call": lambda out: slot_gather_one_call(query, kv_cache, meta, out, scale),
        "the backend": backend_path,
    }
    outs = {name: torch.empty_like(query) for name in ways}
    for name, fn in ways.items():
        fn(outs[name])
    reference = outs["slot gather, one call"]
    wall: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, fn in ways.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(outs[name])
            cpu[name].append(1e3 * (time.process_time() - start_cpu))
            wall[name].append(1e3 * (time.perf_counter() - start))
    used = sum(meta.seq_lens_cpu)
    print(
        f"batch {args.batch}, context {args.min_len}-{args.max_len} ({used} tokens), torch threads {torch.get_num_threads()}"
    )
    for name in ways:
        err = (outs[name] - reference).abs().max().item()
        print(
            f"  {name:24} wall min {min(wall[name]):7.2f} median {statistics.median(wall[name]):7.2f} ms | "
            f"cpu min {min(cpu[name]):7.2f} median {statistics.median(cpu[name]):7.2f} ms | max|diff| {err:.1e}"
        )


if __name__ == "__main__":
    main()

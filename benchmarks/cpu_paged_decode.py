"""The CPU in-place decode kernel alone, this tree's against a git revision's, alternated in one process.

    OMP_NUM_THREADS=1 python benchmarks/cpu_paged_decode.py [--baseline-rev HEAD] [--threads 1]

The table workload's decode shape by default: 32 requests with contexts uniform in [32, 256],
H=12, Hkv=4, D=64, block 16, fp32. ``--caches`` copies of the cache are rotated so reads come from
memory, as in a model whose layers' caches together exceed the last-level cache. The baseline is
``minivllm/attention/cpu_paged_decode.py`` as of ``--baseline-rev``, built under its own cache key.
Prints process CPU ms per layer call (min and median over interleaved repeats) and the largest
difference of each from the torch reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minivllm.attention import cpu_paged_decode


def load_revision(rev: str):
    """The kernel module as of git revision ``rev``, imported under another name."""
    text = subprocess.run(
        ["git", "show", f"{rev}:minivllm/attention/cpu_paged_decode.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "cpu_paged_decode_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("cpu_paged_decode_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def reference(query, kv_cache, tables, seq_lens, scale):
    """Per request: gather its slots and run SDPA (GQA by repeating KV heads). (B, H, D)"""
    _, _, bs, hkv, _ = kv_cache.shape
    out = []
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        slots = tables[b, pos // bs].long() * bs + pos % bs
        k = kv_cache[0].reshape(-1, hkv, kv_cache.shape[-1])[slots].transpose(0, 1)  # (Hkv, n, D)
        v = kv_cache[1].reshape(-1, hkv, kv_cache.shape[-1])[slots].transpose(0, 1)
        g = query.shape[1] // hkv
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        w = torch.softmax((query[b][:, None, :] @ k.transpose(1, 2)) * scale, dim=-1)  # (H, 1, n)
        out.append((w @ v)[:, 0])
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--caches", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, D, bs = args.batch, args.heads, args.kv_heads, args.head_dim, args.block_size
    seq_lens = torch.randint(args.min_len, args.max_len + 1, (B,), generator=gen, dtype=torch.int32)
    nblocks = [-(-int(n) // bs) for n in seq_lens]
    num_blocks = sum(nblocks) + 4
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(nblocks)
    tables = torch.zeros(B, width, dtype=torch.int32)
    used = 0
    for b, nb in enumerate(nblocks):
        tables[b, :nb] = perm[used : used + nb]
        used += nb
    caches = [torch.randn(2, num_blocks, bs, Hkv, D, generator=gen) for _ in range(args.caches)]
    query = torch.randn(B, H, D, generator=gen)
    rows = torch.arange(B, dtype=torch.int64)
    scale = D**-0.5
    ways = {"baseline " + args.baseline_rev: load_revision(args.baseline_rev), "this tree": cpu_paged_decode}
    libs = {name: mod.load() for name, mod in ways.items()}
    expected = reference(query, caches[0], tables, seq_lens.tolist(), scale)
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for name, mod in ways.items():
        out = torch.empty_like(query)
        mod.paged_decode(libs[name], query, caches[0], out, tables, seq_lens, rows, scale, None, None)
        err = (out - expected).abs().max().item()
        print(f"{name}: max|diff| from the torch reference {err:.1e}")
    i = 0
    for _ in range(args.repeats):
        for name, mod in ways.items():
            out = torch.empty_like(query)
            start = time.process_time()
            for _ in range(args.caches):
                mod.paged_decode(
                    libs[name], query, caches[i % args.caches], out, tables, seq_lens, rows, scale, None, None
                )
                i += 1
            cpu[name].append(1e3 * (time.process_time() - start) / args.caches)
    print(
        f"{B} requests, context {args.min_len}-{args.max_len} (mean {seq_lens.float().mean():.0f}), "
        f"H={H} Hkv={Hkv} D={D} block {bs}, threads {args.threads}: CPU ms per layer call"
    )
    for name in ways:
        print(f"  {name:20} min {min(cpu[name]):6.3f} median {statistics.median(cpu[name]):6.3f}")


if __name__ == "__main__":
    main()

"""Time the Triton paged attention kernel against PyTorch SDPA on unpaged copies.

    PYTHONPATH=. python benchmarks/attention.py                # CUDA: the full table
    PYTHONPATH=. python benchmarks/attention.py --cpu-smoke    # tiny shapes, Triton interpreter
    PYTHONPATH=. python benchmarks/attention.py --batches 256 --contexts 4096 --json out.json

The defaults are Qwen3-0.6B's attention (16 query / 8 KV heads, head_dim 128, bf16):
decode batches of 1, 64 and 256 requests at contexts 512-4096, and a prefill chunk.

Bandwidth counts the bytes of K and V the kernel must read (each request's
context once per KV head) and is compared with this GPU's device-to-device copy
bandwidth measured here (bytes read + written per second of a large copy).
SDPA runs on the same keys/values gathered into contiguous (B, S, Hkv, D)
tensors; "gather+sdpa" times the gather too, as an unpaged engine would not
need it but a paged one would. Every request of a scenario has the same
lengths so that SDPA needs no padding. A small decode batch runs twice: with
the kernel's own split-KV choice and with one split, to show what splitting buys.
``--mixed B LOW HIGH`` adds a decode batch of B requests whose contexts are drawn
uniformly in [LOW, HIGH] (seed 0), as a serving batch holds them (nano-vllm's
workload: 256 requests, contexts of 100-2048); SDPA would need padding there, so
only the kernel is timed and checked against SDPA on a few of its requests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch

from minivllm.bench.timing import kernel_timer  # torch only: Triton's kernels load later

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Scenario:
    name: str
    num_reqs: int
    context_len: int
    """Tokens per request after this step (cached + new)."""
    query_len: int
    """New tokens per request (1: decode)."""
    num_splits: int | None = None
    """KV splits forced on the kernel (None: its own choice)."""
    contexts: tuple[int, ...] | None = None
    """Mixed decode: each request's context (context_len is their maximum)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256], help="decode requests per step")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096], help="decode context lengths")
    p.add_argument(
        "--small-batch",
        type=int,
        default=4,
        help="requests of a decode case at the longest context, with and without split-KV (0: skip)",
    )
    p.add_argument(
        "--prefill",
        type=int,
        nargs=3,
        default=[4, 512, 2048],
        metavar=("REQS", "CHUNK", "CONTEXT"),
        help="prefill-chunk case: requests, new tokens each, context after the chunk",
    )
    p.add_argument(
        "--mixed",
        type=int,
        nargs=3,
        metavar=("REQS", "LOW", "HIGH"),
        help="a decode case of REQS requests with contexts uniform in [LOW, HIGH]",
    )
    p.add_argument("--num-heads", type=int, default=16)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through Triton's interpreter")
    p.add_argument("--json", metavar="PATH", help="also write the device, copy bandwidth and rows here")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.batches, args.contexts, args.prefill, args.small_batch = [2], [33, 64], [2, 16, 48], 1
        args.num_heads, args.num_kv_heads, args.head_dim = 4, 2, 64
    return args


def copy_bandwidth(device: torch.device, timer, nbytes: int) -> float:
    """Bytes per second moved by ``dst.copy_(src)``, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src))


def build_inputs(sc: Scenario, args: argparse.Namespace, device: torch.device) -> dict[str, torch.Tensor]:
    """A paged cache with the blocks of all requests shuffled, plus queries and metadata."""
    dtype, bs = DTYPES[args.dtype], args.block_size
    blocks_per_req = math.ceil(sc.context_len / bs)
    num_blocks = sc.num_reqs * blocks_per_req
    block_tables = torch.randperm(num_blocks, device=device).view(sc.num_reqs, blocks_per_req).int()
    kv_cache = torch.randn(2, num_blocks, bs, args.num_kv_heads, args.head_dim, dtype=dtype, device=device)
    query = torch.randn(sc.num_reqs * sc.query_len, args.num_heads, args.head_dim, dtype=dtype, device=device)
    return dict(
        query=query,  # (T, H, D)
        kv_cache=kv_cache,  # (2, num_blocks, block_size, Hkv, D)
        query_start_loc=torch.arange(0, query.shape[0] + 1, sc.query_len, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(sc.contexts or [sc.context_len] * sc.num_reqs, dtype=torch.int32, device=device),
        block_tables=block_tables,  # (B, blocks_per_req)
    )


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor, context_len: int) -> torch.Tensor:
    """(2, B, Hkv, S, D) keys and values of every request: a view of one contiguous
    (2, B, S, Hkv, D) copy, the layout an unpaged cache would hold."""
    kv = kv_cache[:, block_tables.long()]  # (2, B, blocks, block_size, Hkv, D), the one copy
    return kv.flatten(2, 3)[:, :, :context_len].transpose(2, 3)


def sdpa(q: torch.Tensor, kv: torch.Tensor, query_len: int) -> torch.Tensor:
    """q (B, H, L, D), kv (2, B, Hkv, S, D) -> (B, H, L, D), queries at the last L positions."""
    from torch.nn.attention.bias import causal_lower_right

    mask = None if query_len == 1 else causal_lower_right(query_len, kv.shape[3])
    return torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, enable_gqa=True)


def run_scenario(sc: Scenario, args: argparse.Namespace, device: torch.device, timer, copy_bw: float) -> dict:
    from minivllm.attention.ops import paged_attention  # after TRITON_INTERPRET is settled

    x = build_inputs(sc, args, device)
    out = torch.empty_like(x["query"])

    def triton_attention() -> torch.Tensor:
        return paged_attention(
            x["query"],
            x["kv_cache"],
            x["query_start_loc"],
            x["seq_lens"],
            x["block_tables"],
            max_query_len=sc.query_len,
            max_seq_len=sc.context_len,
            scale=args.head_dim**-0.5,
            out=out,
            num_splits=sc.num_splits,
        )

    q = x["query"].view(sc.num_reqs, sc.query_len, args.num_heads, args.head_dim).transpose(1, 2)  # (B, H, L, D)
    if sc.contexts:
        return _mixed_row(sc, args, x, q, timer(triton_attention), triton_attention(), copy_bw)
    kv = gather_kv(x["kv_cache"], x["block_tables"], sc.context_len)
    t_triton = timer(triton_attention)
    t_sdpa = timer(lambda: sdpa(q, kv, sc.query_len))
    t_gather_sdpa = timer(lambda: sdpa(q, gather_kv(x["kv_cache"], x["block_tables"], sc.context_len), sc.query_len))
    expected = sdpa(q, kv, sc.query_len).transpose(1, 2).reshape_as(out)
    kv_bytes = kv.numel() * kv.element_size()
    # Causal chunk: query j of L sees context_len - L + j + 1 keys; two matmuls of 2*D flops each.
    visible = sc.num_reqs * sum(sc.context_len - sc.query_len + j + 1 for j in range(sc.query_len))
    flops = 4 * visible * args.num_heads * args.head_dim
    return {
        "case": sc.name,
        "triton ms": t_triton * 1e3,
        "KV GB/s": kv_bytes / t_triton / 1e9,
        "% copy bw": 100 * kv_bytes / t_triton / copy_bw,
        "TFLOP/s": flops / t_triton / 1e12,
        "sdpa ms": t_sdpa * 1e3,
        "gather+sdpa ms": t_gather_sdpa * 1e3,
        "max |diff|": (triton_attention().float() - expected.float()).abs().max().item(),
    }


def _mixed_row(
    sc: Scenario, args, x: dict, q: torch.Tensor, t_triton: float, out: torch.Tensor, copy_bw: float
) -> dict:
    """A mixed decode batch: the kernel's time and bandwidth, checked against SDPA on 4 requests."""
    element = x["kv_cache"].element_size()
    kv_bytes = 2 * sum(sc.contexts) * args.num_kv_heads * args.head_dim * element
    diff = 0.0
    for b in range(min(4, sc.num_reqs)):
        kv = gather_kv(x["kv_cache"], x["block_tables"][b : b + 1], sc.contexts[b])
        expected = sdpa(q[b : b + 1], kv, 1).transpose(1, 2).reshape(1, args.num_heads, args.head_dim)
        diff = max(diff, (out[b : b + 1].float() - expected.float()).abs().max().item())
    return {
        "case": sc.name,
        "triton ms": t_triton * 1e3,
        "KV GB/s": kv_bytes / t_triton / 1e9,
        "% copy bw": 100 * kv_bytes / t_triton / copy_bw,
        "TFLOP/s": 4 * sum(sc.contexts) * args.num_heads * args.head_dim / t_triton / 1e12,
        "sdpa ms": float("nan"),
        "gather+sdpa ms": float("nan"),
        "max |diff|": diff,
    }


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    cells = [[r[c] if isinstance(r[c], str) else f"{r[c]:.4g}" for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    for line in [cols, ["-" * w for w in widths], *cells]:
        print("  ".join(s.rjust(w) for s, w in zip(line, widths)))


def main() -> int:
    args = parse_args()
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print(
            "benchmarks/attention.py needs a CUDA device (none found); "
            "--cpu-smoke runs tiny shapes through the Triton interpreter instead.",
            file=sys.stderr,
        )
        return 2
    timer = kernel_timer(device, time.perf_counter)
    copy_bw = copy_bandwidth(device, timer, nbytes=(1 << 30) if device.type == "cuda" else (64 << 20))
    reqs, chunk, context = args.prefill
    scenarios = [Scenario(f"decode {b}x{c}", b, c, 1) for b in args.batches for c in args.contexts]
    if args.small_batch:
        small = f"decode {args.small_batch}x{max(args.contexts)}"
        scenarios += [
            Scenario(small, args.small_batch, max(args.contexts), 1),
            Scenario(f"{small} no split", args.small_batch, max(args.contexts), 1, num_splits=1),
        ]
    scenarios.append(Scenario(f"prefill {reqs}x{chunk}@{context}", reqs, context, chunk))
    if args.mixed:
        count, low, high = args.mixed
        drawn = torch.randint(low, high + 1, (count,), generator=torch.Generator().manual_seed(0)).tolist()
        scenarios.append(Scenario(f"decode {count}x[{low}-{high}] mixed", count, max(drawn), 1, contexts=tuple(drawn)))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (Triton interpreter: timings meaningless)"
    print(
        f"{name}; {args.dtype}, heads {args.num_heads}/{args.num_kv_heads} (q/kv), head_dim {args.head_dim}, "
        f"block_size {args.block_size}; copy bandwidth {copy_bw / 1e9:.1f} GB/s"
    )
    rows = [run_scenario(sc, args, device, timer, copy_bw) for sc in scenarios]
    print_table(rows)
    if args.json:
        write_json(args.json, name, copy_bw, args, scenarios, rows)
    return 0


def write_json(
    path: str, device_name: str, copy_bw: float, args: argparse.Namespace, scenarios: list[Scenario], rows: list[dict]
) -> None:
    """The table as JSON (each row with its scenario's numbers), the copy bandwidth and the shape."""
    shape = {k: getattr(args, k) for k in ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size")}
    rows = [
        {
            "num_reqs": sc.num_reqs,
            "context_len": sc.context_len,
            "query_len": sc.query_len,
            "num_splits": sc.num_splits,
            **row,
        }
        for sc, row in zip(scenarios, rows)
    ]
    record = {"device": device_name, "copy_bandwidth_gb_s": copy_bw / 1e9, **shape, "rows": rows}
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())

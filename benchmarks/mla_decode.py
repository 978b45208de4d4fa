"""Time the Triton MLA decode kernel (DeepSeek's latent cache) against the torch absorbed form,
and (``--prefill``) the Triton MLA prefill kernel against the torch expanded form.

    PYTHONPATH=. python benchmarks/mla_decode.py                # CUDA: DeepSeek V3's latent, the full table
    PYTHONPATH=. python benchmarks/mla_decode.py --cpu-smoke    # tiny shapes, Triton interpreter
    PYTHONPATH=. python benchmarks/mla_decode.py --prefill      # CUDA: prefill chunks over expanded contexts

The defaults are DeepSeek V3's attention per rank: 128 heads (tp=1) or 16 (tp=8) over a
latent of kv_lora_rank 512 + rope 64, bf16, blocks of 16. Bandwidth counts the latent
bytes a decode step must read (each request's context once, shared by all its heads) and
is compared with this device's copy bandwidth measured here (bytes read + written per
second of a large copy). The torch row is ``attention/mla.py``'s absorbed form on the
same paged cache (gather, then SDPA over the one latent head).

``--prefill`` times ``ops/triton_mla_prefill.py`` on one request's chunk of ``--chunks``
queries at the end of ``--contexts`` positions (keys already expanded: nope 128 + rope 64,
value 128, as V3), against ``attention/mla.py``'s ``varlen_attention`` (SDPA with a causal
mask); TFLOP/s counts the causal half of the score and value products.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from minivllm.bench.timing import kernel_timer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--heads", type=int, nargs="+", default=[128, 16])
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--rope-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill", action="store_true", help="the prefill kernel instead of the decode kernel")
    p.add_argument("--chunks", type=int, nargs="+", default=[512, 2048], help="--prefill: queries per chunk")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through Triton's interpreter")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.batches, args.contexts, args.heads, args.kv_lora_rank, args.rope_dim = [2], [40], [4], 32, 16
        args.chunks = [8]
    if args.prefill and not args.cpu_smoke and args.contexts == [1024, 4096]:
        args.contexts = [2048, 8192]
    return args


def run_prefill(args: argparse.Namespace, chunk: int, context: int, heads: int, device, timer) -> dict:
    from minivllm.attention.mla import varlen_attention
    from minivllm.attention.ops.triton_mla_prefill import mla_prefill

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dn, dr, dv = (128, 64, 128) if not args.cpu_smoke else (16, 16, 16)
    chunk = min(chunk, context)
    q_nope, q_pe = (
        torch.randn(chunk, heads, dn, device=device, dtype=dtype),
        torch.randn(chunk, heads, dr, device=device, dtype=dtype),
    )
    k_nope, k_pe = (
        torch.randn(context, heads, dn, device=device, dtype=dtype),
        torch.randn(context, dr, device=device, dtype=dtype),
    )
    v = torch.randn(context, heads, dv, device=device, dtype=dtype)
    cu_q = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, context], dtype=torch.int32, device=device)
    scale = (dn + dr) ** -0.5
    kernel_s = timer(lambda: mla_prefill(q_nope, q_pe, k_nope, k_pe, v, cu_q, cu_k, max_query_len=chunk, scale=scale))
    torch_s = timer(lambda: varlen_attention(q_nope, q_pe, k_nope, k_pe, v, ((chunk, context),), scale))
    pairs = chunk * (context - chunk) + chunk * (chunk + 1) / 2  # (query, visible key) pairs
    flops = 2 * pairs * heads * (dn + dr + dv)
    return dict(
        chunk=chunk,
        context=context,
        heads=heads,
        kernel_us=kernel_s * 1e6,
        torch_us=torch_s * 1e6,
        tflops=flops / kernel_s / 1e12,
    )


def run(args: argparse.Namespace, batch: int, context: int, heads: int, device, timer, copy_bw: float) -> dict:
    from minivllm.attention.mla import _absorbed, gather_latent
    from minivllm.attention.ops.triton_mla_decode import mla_decode

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    r, dr, bs = args.kv_lora_rank, args.rope_dim, args.block_size
    blocks_per_req = -(-context // bs)
    cache = torch.randn(batch * blocks_per_req, bs, 1, r + dr, device=device).to(dtype)
    tables = torch.randperm(batch * blocks_per_req, device=device).view(batch, -1).int()
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, r + dr, device=device).to(dtype)
    scale = (r + dr) ** -0.5
    kernel_s = timer(lambda: mla_decode(q, cache, tables, seq_lens, kv_lora_rank=r, scale=scale))
    eye = torch.eye(r, device=device, dtype=dtype).expand(heads, r, r)  # W_UK = W_UV = I: latent in, latent out

    def torch_absorbed():
        lat = gather_latent(cache, tables.long(), dtype)
        q_pos = (seq_lens.long() - 1).view(-1, 1)
        return _absorbed(q[:, None, :, :r], q[:, None, :, r:], lat, q_pos, eye, eye, scale)

    torch_s = timer(torch_absorbed)
    nbytes = batch * context * (r + dr) * cache.element_size()
    return dict(
        batch=batch,
        context=context,
        heads=heads,
        kernel_us=kernel_s * 1e6,
        torch_us=torch_s * 1e6,
        gbps=nbytes / kernel_s / 1e9,
        pct_copy=100 * nbytes / kernel_s / copy_bw,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("on the CPU the kernel runs in Triton's interpreter: set TRITON_INTERPRET=1 (--cpu-smoke)")
    timer = kernel_timer(device, time.perf_counter)
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * nbytes / timer(lambda: dst.copy_(src))
    print(
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, copy {copy_bw / 1e9:.0f} GB/s"
    )
    if args.prefill:
        print(f"{'heads':>5} {'chunk':>5} {'context':>7} {'kernel us':>10} {'torch us':>10} {'TFLOP/s':>8}")
        for heads in args.heads:
            for chunk in args.chunks:
                for context in args.contexts:
                    row = run_prefill(args, chunk, context, heads, device, timer)
                    print(
                        f"{row['heads']:>5} {row['chunk']:>5} {row['context']:>7} {row['kernel_us']:>10.1f} "
                        f"{row['torch_us']:>10.1f} {row['tflops']:>8.2f}"
                    )
        return 0
    print(f"{'heads':>5} {'batch':>5} {'context':>7} {'kernel us':>10} {'torch us':>10} {'GB/s':>7} {'% copy':>7}")
    for heads in args.heads:
        for batch in args.batches:
            for context in args.contexts:
                row = run(args, batch, context, heads, device, timer, copy_bw)
                print(
                    f"{row['heads']:>5} {row['batch']:>5} {row['context']:>7} {row['kernel_us']:>10.1f} "
                    f"{row['torch_us']:>10.1f} {row['gbps']:>7.1f} {row['pct_copy']:>7.1f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

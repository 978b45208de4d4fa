"""Time the Triton Gated DeltaNet kernels (Qwen3-Next's linear-attention layers): the recurrent
decode step against the bytes it must move, and the chunked prefill in TFLOP/s.

    PYTHONPATH=. python benchmarks/gated_delta_rule.py                # CUDA: Qwen3-Next-80B's shapes
    PYTHONPATH=. python benchmarks/gated_delta_rule.py --cpu-smoke    # tiny shapes, Triton interpreter

The defaults are Qwen3-Next-80B's Gated DeltaNet layer: 32 v-heads over 16 k-heads (q and k
expanded to 32 heads, as the kernels take them), Dk = Dv = 128, bf16 activations, fp32
states, a conv of kernel 4 over the 2 * 16 * 128 + 32 * 128 mixed q/k/v channels.

Decode (one token per sequence, batch 1/64/256): the bytes a step must move are each state
read and written once (fp32) plus the step's q, k, v read and o written, compared with this
device's copy bandwidth measured here (bytes read + written per second of a large copy);
the conv row counts its input, output, weights and its (K - 1)-input states read and written.
Prefill: one call of the chunked form over sequences of the given lengths; TFLOP/s counts the
chunk form's matmuls (per chunk of c tokens and head: ``3 c^2 Dk + 2 c^2 Dv + 3 c Dk Dv``
multiply-adds), not the triangular solve.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from minivllm.bench.timing import kernel_timer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256], help="decode batch sizes")
    p.add_argument("--prefill", type=int, nargs="+", default=[4096, 8 * 512], help="prefill tokens per call")
    p.add_argument("--prefill-seqs", type=int, nargs="+", default=[1, 8], help="sequences per prefill call")
    p.add_argument("--heads", type=int, default=32, help="v-heads")
    p.add_argument("--k-heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128, help="Dk = Dv")
    p.add_argument("--conv-kernel", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--json", metavar="PATH", help="also write the device, copy bandwidth and rows here")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through Triton's interpreter")
    args = p.parse_args(argv)
    if len(args.prefill) != len(args.prefill_seqs):
        p.error("--prefill and --prefill-seqs pair up: give as many of each")
    if args.cpu_smoke:
        args.batches, args.prefill, args.prefill_seqs = [2], [40], [2]
        args.heads, args.k_heads, args.head_dim, args.chunk_size = 2, 1, 16, 16
    return args


def _inputs(args, tokens: int, seqs: int, device, dtype):
    """q, k, v, g, beta of ``tokens`` tokens split evenly into ``seqs`` sequences; states, one
    slot per sequence (in reverse order), each from a state; cu_seqlens."""
    h, d = args.heads, args.head_dim
    q = F.normalize(torch.randn(tokens, args.k_heads, d, device=device), dim=-1).to(dtype)
    k = F.normalize(torch.randn(tokens, args.k_heads, d, device=device), dim=-1).to(dtype)
    q, k = (x.repeat_interleave(h // args.k_heads, dim=1) for x in (q, k))
    v = torch.randn(tokens, h, d, device=device).to(dtype)
    g = -torch.rand(tokens, h, device=device) * 0.1
    beta = torch.rand(tokens, h, device=device)
    per_seq = tokens // seqs
    cu = torch.arange(0, seqs + 1, device=device, dtype=torch.int32) * per_seq
    cu[-1] = tokens
    states = torch.randn(seqs, h, d, d, device=device) * 0.1
    slots = torch.arange(seqs - 1, -1, -1, device=device, dtype=torch.int32)
    has_init = torch.ones(seqs, dtype=torch.bool, device=device)
    return (q, k, v, g, beta), dict(
        scale=d**-0.5, states=states, state_indices=slots, cu_seqlens=cu, has_initial_state=has_init
    )


def decode_rows(args, batch: int, device, dtype, timer, copy_bw: float) -> list[dict]:
    from minivllm.layers.ops.triton_gated_delta_net import causal_conv1d, recurrent_gated_delta_rule

    h, d = args.heads, args.head_dim
    rule_in, per_seq = _inputs(args, batch, batch, device, dtype)
    seconds = timer(lambda: recurrent_gated_delta_rule(*rule_in, **per_seq))
    elt = torch.finfo(dtype).bits // 8
    nbytes = batch * h * d * d * 4 * 2 + batch * h * (3 * d) * elt + batch * h * d * elt
    rows = [dict(case="decode rule", batch=batch, tokens=batch, us=seconds * 1e6, gbps=nbytes / seconds / 1e9)]
    channels, width = 2 * args.k_heads * d + h * d, args.conv_kernel
    x = torch.randn(batch, channels, device=device).to(dtype)
    weight = torch.randn(channels, width, device=device).to(dtype)
    bias = torch.randn(channels, device=device).to(dtype)
    conv_states = torch.randn(batch, channels, width - 1, device=device).to(dtype)
    conv_seq = dict(
        state_indices=per_seq["state_indices"],
        cu_seqlens=per_seq["cu_seqlens"],
        has_initial_state=per_seq["has_initial_state"],
    )
    seconds = timer(lambda: causal_conv1d(x, weight, bias, conv_states=conv_states, **conv_seq))
    nbytes = (2 * batch * channels + channels * (width + 1) + 2 * batch * channels * (width - 1)) * elt
    rows.append(dict(case="decode conv", batch=batch, tokens=batch, us=seconds * 1e6, gbps=nbytes / seconds / 1e9))
    for row in rows:
        row["pct_copy"] = 100 * row["gbps"] * 1e9 / copy_bw
    return rows


def prefill_row(args, tokens: int, seqs: int, device, dtype, timer) -> dict:
    from minivllm.layers.ops.triton_gated_delta_net import chunk_gated_delta_rule

    rule_in, per_seq = _inputs(args, tokens, seqs, device, dtype)
    seconds = timer(lambda: chunk_gated_delta_rule(*rule_in, **per_seq, chunk_size=args.chunk_size))
    c, d, h = args.chunk_size, args.head_dim, args.heads
    lens = per_seq["cu_seqlens"].diff().tolist()
    chunks = sum(-(-n // c) for n in lens)
    flops = 2 * h * chunks * (3 * c * c * d + 2 * c * c * d + 3 * c * d * d)
    return dict(case="prefill chunk", batch=seqs, tokens=tokens, us=seconds * 1e6, tflops=flops / seconds / 1e12)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("on the CPU the kernels run in Triton's interpreter: set TRITON_INTERPRET=1 (--cpu-smoke)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter's bf16 dots are wrong
    timer = kernel_timer(device, time.perf_counter)
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * nbytes / timer(lambda: dst.copy_(src))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, copy {copy_bw / 1e9:.0f} GB/s")
    print(f"H{args.heads} (k-heads {args.k_heads}) Dk=Dv={args.head_dim}, {str(dtype).removeprefix('torch.')}")
    print(f"{'case':>13} {'batch':>5} {'tokens':>6} {'us':>9} {'GB/s':>7} {'% copy':>7} {'TFLOP/s':>8}")
    rows = [row for batch in args.batches for row in decode_rows(args, batch, device, dtype, timer, copy_bw)]
    rows += [prefill_row(args, t, n, device, dtype, timer) for t, n in zip(args.prefill, args.prefill_seqs)]
    for r in rows:
        gbps = f"{r['gbps']:>7.1f} {r['pct_copy']:>7.1f}" if "gbps" in r else f"{'-':>7} {'-':>7}"
        tflops = f"{r['tflops']:>8.2f}" if "tflops" in r else f"{'-':>8}"
        print(f"{r['case']:>13} {r['batch']:>5} {r['tokens']:>6} {r['us']:>9.1f} {gbps} {tflops}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, copy_bandwidth_gb_s=copy_bw / 1e9, rows=rows), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

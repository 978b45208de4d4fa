"""Multi-turn chat whose shared prefixes exceed the device KV cache: hit rate and TTFT with
and without the host-memory tier (``cache.kv_offloading_size``).

``--conversations`` chats, each with its own ``--system-len``-token system prompt, take
turns round-robin: every turn sends the whole conversation so far plus a new
``--user-len``-token message, and generates ``--max-tokens``. The device cache holds
``--num-blocks`` blocks, fewer than all conversations' histories together, so without
offloading a conversation's prefix is mostly evicted by the time its next turn comes;
with it, the prefix comes back from host memory. Both engines have the same device cache;
the runs alternate (off, on, on, off) in one process and each pair is reported.

    python benchmarks/kv_offloading.py --conversations 8 --turns 4 --system-len 512 --num-blocks 160
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from minivllm import LLM, SamplingParams


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-125m", help="preset name or checkpoint directory")
    p.add_argument("--load-format", default="dummy", help="auto, safetensors, pt or dummy (random weights)")
    p.add_argument("--hf-overrides", default="{}", help='JSON merged into config.json, e.g. {"num_hidden_layers": 2}')
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=512, help="tokens of each conversation's system prompt")
    p.add_argument("--user-len", type=int, default=32, help="tokens of each user message")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens generated per turn")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=160, help="device KV blocks (less than the histories)")
    p.add_argument("--offload-gib", type=float, default=1.0, help="cache.kv_offloading_size of the 'on' runs")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def run(args: argparse.Namespace, offload: bool) -> dict:
    llm = LLM(
        model=args.model,
        load_format=args.load_format,
        hf_overrides=json.loads(args.hf_overrides),
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_gpu_blocks_override=args.num_blocks,
        max_num_seqs=args.conversations,
        kv_offloading_size=args.offload_gib if offload else None,
        seed=args.seed,
        disable_log_stats=True,
    )
    try:
        vocab = min(llm.cfg.hf_config.vocab_size, len(llm.get_tokenizer()))
        rng = random.Random(args.seed)
        draw = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        llm.generate([{"prompt_token_ids": draw(64)}], params, use_tqdm=False)  # warm-up
        histories = [draw(args.system_len) for _ in range(args.conversations)]
        ttfts, outputs, prompt_tokens, cached = [], [], 0, 0
        start = time.perf_counter()
        for _ in range(args.turns):
            for c in range(args.conversations):  # one turn of one chat at a time: TTFT without queueing
                histories[c] = histories[c] + draw(args.user_len)
                sent = time.monotonic()
                out = llm.generate([{"prompt_token_ids": histories[c]}], params, use_tqdm=False)[0]
                ttfts.append(out.metrics["first_token_time"] - sent)
                outputs.append(out.outputs[0].token_ids)
                prompt_tokens += len(out.prompt_token_ids)
                cached += out.num_cached_tokens
                histories[c] = histories[c] + out.outputs[0].token_ids
        seconds = time.perf_counter() - start
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    return {
        "offload": offload,
        "seconds": seconds,
        "mean_ttft_ms": 1e3 * statistics.mean(ttfts),
        "p50_ttft_ms": 1e3 * statistics.median(ttfts),
        "hit_rate": cached / prompt_tokens,
        "device_hits": stats.prefix_cache_hits,
        "host_hits": stats.external_prefix_cache_hits,
        "computed": prompt_tokens - cached,
        "outputs": outputs,
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = [run(args, offload) for offload in (False, True, True, False)]
    print(
        f"{args.conversations} chats x {args.turns} turns: {args.system_len}-token system prompts, "
        f"{args.user_len}-token messages, {args.max_tokens} tokens generated per turn; device cache "
        f"{args.num_blocks} blocks of {args.block_size}; torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'offload':>8} {'seconds':>8} {'mean TTFT ms':>13} {'p50 TTFT ms':>12} {'hit rate':>9} "
        f"{'device hits':>12} {'host hits':>10} {'computed':>9}"
    )
    for r in results:
        print(
            f"{'on' if r['offload'] else 'off':>8} {r['seconds']:8.2f} {r['mean_ttft_ms']:13.1f} "
            f"{r['p50_ttft_ms']:12.1f} {100 * r['hit_rate']:8.1f}% {r['device_hits']:12d} "
            f"{r['host_hits']:10d} {r['computed']:9d}"
        )
    off = [r for r in results if not r["offload"]]
    on = [r for r in results if r["offload"]]
    print(
        f"mean TTFT off/on: {statistics.mean(r['mean_ttft_ms'] for r in off) / statistics.mean(r['mean_ttft_ms'] for r in on):.2f}x; "
        f"identical greedy outputs: {all(r['outputs'] == results[0]['outputs'] for r in results)}"
    )


if __name__ == "__main__":
    main()

"""Throughput with and without prefix caching on a long shared system prompt.

Every request is ``--prefix-len`` shared tokens (a system prompt) followed by
``--suffix-len`` tokens of its own. Both runs use the same engine settings and
the same KV cache size (by default, room for every request at once, so neither
run preempts); the only difference is ``cache.enable_prefix_caching``. With it,
each request after the first computes only its suffix, so the speedup should
approach (prompt tokens + decode work) / (prompt tokens actually computed + decode work).
Decode work is the same in both runs (and on the CPU, the torch backend's decode
attention over long contexts is a large part of it), so the script also reports
the prefill phase on its own: the time until every request has its first token,
and the mean time to first token.

    python benchmarks/prefix_caching.py --model opt-125m --load-format dummy \\
        --hf-overrides '{"num_hidden_layers": 2}' --num-requests 64 --prefix-len 1024
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm.utils import cdiv


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-125m", help="preset name or checkpoint directory")
    p.add_argument("--load-format", default="dummy", help="auto, safetensors, pt or dummy (random weights)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (defaults to the model's)")
    p.add_argument("--hf-overrides", default="{}", help='JSON merged into config.json, e.g. {"num_hidden_layers": 2}')
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=1024, help="tokens of the shared system prompt")
    p.add_argument("--suffix-len", type=int, default=32, help="tokens of each request's own question")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks; default: every request at once")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_prompts(args: argparse.Namespace, vocab_size: int) -> list[dict]:
    rng = random.Random(args.seed)
    draw = lambda n: [rng.randrange(3, vocab_size) for _ in range(n)]  # noqa: E731
    system = draw(args.prefix_len)
    return [{"prompt_token_ids": system + draw(args.suffix_len)} for _ in range(args.num_requests)]


def run(args: argparse.Namespace, prefix_caching: bool, num_blocks: int) -> dict:
    llm = LLM(
        model=args.model,
        tokenizer=args.tokenizer,
        load_format=args.load_format,
        hf_overrides=json.loads(args.hf_overrides),
        dtype=args.dtype,
        block_size=args.block_size,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=prefix_caching,
        seed=args.seed,
    )
    try:
        vocab = min(llm.cfg.hf_config.vocab_size, len(llm.get_tokenizer()))
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        warm = random.Random(-1)
        llm.generate([[warm.randrange(3, vocab) for _ in range(64)]], params, use_tqdm=False)  # warm-up
        prompts = make_prompts(args, vocab)
        start, start_mono = time.perf_counter(), time.monotonic()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        first_tokens = [o.metrics["first_token_time"] - start_mono for o in outs]
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    output_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    warm_queries = 64 if prefix_caching else 0
    return {
        "prefix_caching": prefix_caching,
        "seconds": seconds,
        "all_first_tokens_s": max(first_tokens),
        "mean_ttft_s": sum(first_tokens) / len(first_tokens),
        "requests_per_s": len(outs) / seconds,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "prefix_cache_hit_tokens": stats.prefix_cache_hits,
        "prefix_cache_hit_rate": stats.prefix_cache_hits / max(stats.prefix_cache_queries - warm_queries, 1),
        "prompt_tokens_computed": prompt_tokens - stats.prefix_cache_hits,
        "preemptions": stats.num_preemptions,
        "token_ids": [o.outputs[0].token_ids for o in outs],
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    per_request = cdiv(args.prefix_len + args.suffix_len + args.max_tokens, args.block_size)
    num_blocks = args.num_blocks or per_request * args.num_requests + cdiv(64 + args.max_tokens, args.block_size)
    results = [run(args, caching, num_blocks) for caching in (False, True)]
    off, on = results
    print(
        f"{args.num_requests} requests: {args.prefix_len}-token shared prefix + {args.suffix_len} own tokens, "
        f"{args.max_tokens} generated each; {num_blocks} KV blocks of {args.block_size}; "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'prefix caching':>15} {'seconds':>8} {'req/s':>7} {'tok/s (all)':>12} {'out tok/s':>10} "
        f"{'all 1st tokens s':>17} {'mean TTFT s':>12} {'prompt tok computed':>20} {'hit rate':>9}"
    )
    for r in results:
        print(
            f"{'on' if r['prefix_caching'] else 'off':>15} {r['seconds']:8.2f} {r['requests_per_s']:7.2f} "
            f"{r['total_tokens_per_s']:12.1f} {r['output_tokens_per_s']:10.1f} {r['all_first_tokens_s']:17.2f} "
            f"{r['mean_ttft_s']:12.2f} {r['prompt_tokens_computed']:20d} {100 * r['prefix_cache_hit_rate']:8.1f}%"
        )
    print(
        f"speedup: throughput {off['seconds'] / on['seconds']:.2f}x, prefill phase "
        f"{off['all_first_tokens_s'] / on['all_first_tokens_s']:.2f}x; prompt tokens computed "
        f"{off['prompt_tokens_computed'] / max(on['prompt_tokens_computed'], 1):.1f}x fewer; "
        f"identical greedy outputs: {off['token_ids'] == on['token_ids']}"
    )


if __name__ == "__main__":
    main()

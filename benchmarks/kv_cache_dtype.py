"""KV-cache memory per token and blocks per budget: the model dtype's cache against fp8.

Builds the engine for a preset on random weights (``load.format=dummy``), once per
``cache.cache_dtype``, with the same memory budget, and prints the cache's bytes
per token, the blocks and tokens that fit, the bytes actually allocated, and the
decode speed of a short greedy run (on the CPU the fp8 cache is converted in torch
on every read, so expect it slower there; on a GPU the kernels convert in registers)::

    python benchmarks/kv_cache_dtype.py --model llama-3.2-1b --cpu-memory-gb 6
"""

from __future__ import annotations

import argparse
import time

from minivllm import LLM, SamplingParams

GiB = float(1 << 30)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b", help="preset name or checkpoint directory")
    parser.add_argument("--dtype", default="bfloat16", help="model dtype (the 'auto' cache follows it)")
    parser.add_argument("--cache-dtypes", default="auto,fp8", help="comma-separated cache.cache_dtype values")
    parser.add_argument("--cpu-memory-gb", type=float, default=6.0, help="memory budget on the CPU")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=16, help="decode tokens per request in the timed run")
    parser.add_argument("--max-num-batched-tokens", type=int, default=128, help="step budget (and profile-run size)")
    return parser.parse_args()


def measure(args: argparse.Namespace, cache_dtype: str) -> dict[str, float]:
    llm = LLM(
        model=args.model,
        load_format="dummy",
        dtype=args.dtype,
        kv_cache_dtype=cache_dtype,
        cpu_memory_gb=args.cpu_memory_gb,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    runner = llm.llm_engine.core.executor.worker.model_runner
    block_size = llm.llm_engine.cfg.cache.block_size
    num_blocks = runner.kv_caches[0].shape[1]
    start = time.perf_counter()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100 + i, 116 + i))} for i in range(4)], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    row = {
        "kv_dtype": str(runner.kv_caches[0].dtype).removeprefix("torch."),
        "bytes_per_token": runner.kv_cache_bytes_per_block() / block_size,
        "num_blocks": num_blocks,
        "tokens": num_blocks * block_size,
        "allocated_gib": sum(c.numel() * c.element_size() for c in runner.kv_caches) / GiB,
        "out_tok_s": 4 * args.max_tokens / elapsed,
    }
    llm.shutdown()
    return row


def main() -> None:
    args = parse_args()
    print("| cache.cache_dtype | stored as | KV bytes / token | blocks | tokens | KV allocated (GiB) | out tok/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for cache_dtype in args.cache_dtypes.split(","):
        r = measure(args, cache_dtype)
        print(
            f"| {cache_dtype} | {r['kv_dtype']} | {r['bytes_per_token']:.0f} | {r['num_blocks']} | {r['tokens']} "
            f"| {r['allocated_gib']:.2f} | {r['out_tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()

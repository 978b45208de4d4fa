"""Offline throughput with data parallelism: the same requests through LLM.generate
with parallel.dp=1 and parallel.dp=2 (engine start-up not timed).

    python benchmarks/data_parallel.py --model opt-125m --num-prompts 32 --output-len 32 -- load.format=dummy
"""

from __future__ import annotations

import argparse
import random
import time

from minivllm import LLM, SamplingParams


def measure(model: str, dp: int, prompts: list[list[int]], output_len: int, overrides: list[str]) -> dict:
    llm = LLM(model=model, data_parallel_size=dp, overrides=overrides)
    try:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        llm.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"dp": dp, "seconds": round(seconds, 2), "out_tok_per_s": round(tokens / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--dp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("overrides", nargs="*", help="config overrides (after --)")
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 500) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    for dp in args.dp:
        print(measure(args.model, dp, prompts, args.output_len, args.overrides), flush=True)


if __name__ == "__main__":
    main()

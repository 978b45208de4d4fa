"""Offline throughput with pipeline micro-batching: the same requests through
LLM.generate with parallel.pp=2 and parallel.pp_microbatches=1 (one batch in the
pipeline at a time) and 2 (stage 0 runs one batch while stage 1 runs the other),
with pp=1 (in the engine's process) for reference; engine start-up is not timed.
Besides throughput, each row gives the CPU time each rank's process spent during
the timed run (``time.process_time`` read through ``collective_rpc``; with pp=1
the one process is also the engine's). With load.format=dummy the random
weights depend on the stage layout, so tokens are compared between runs of the
same pp only.

    python benchmarks/pp_microbatches.py --model opt-125m --num-prompts 48 --runs 1:1,2:1,2:2,2:1,2:2 -- \
        load.format=dummy '+model.hf_overrides={num_hidden_layers: 4, hidden_size: 512, ffn_dim: 2048,
        num_attention_heads: 8, word_embed_proj_dim: 512, vocab_size: 2048}'
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from minivllm import LLM, SamplingParams


def measure(
    model: str,
    pp: int,
    microbatches: int,
    prompts: list[list[int]],
    output_len: int,
    overrides: list[str],
    partition: str | None,
) -> dict:
    extra = [f"parallel.pp_microbatches={microbatches}"] if pp > 1 else []
    if pp > 1 and partition:
        extra.append(f"parallel.pp_layer_partition=[{partition}]")
    llm = LLM(model=model, pipeline_parallel_size=pp, overrides=[*overrides, *extra])
    try:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, detokenize=False)
        llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params, use_tqdm=False)  # warm-up
        cpu_before = llm.collective_rpc(_cpu_seconds)
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        cpu = [round(b - a, 2) for a, b in zip(cpu_before, llm.collective_rpc(_cpu_seconds))]
    finally:
        llm.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "pp": pp,
        "pp_microbatches": microbatches if pp > 1 else "-",
        "seconds": round(seconds, 2),
        "out_tok_per_s": round(tokens / seconds, 1),
        "rank_cpu_s": cpu,
        "token_ids": [o.outputs[0].token_ids for o in outs],
    }


def _cpu_seconds(worker: Any) -> float:
    """Runs in each rank's process: the CPU time it has used so far."""
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--runs", default="1:1,2:1,2:2", help="comma-separated pp:microbatches")
    parser.add_argument("--partition", default=None, help="layers per stage for the pp > 1 runs, e.g. 3,1")
    parser.add_argument("overrides", nargs="*", help="config overrides (after --)")
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 500) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    first: dict[int, list] = {}
    for run in args.runs.split(","):
        pp, microbatches = map(int, run.split(":"))
        row = measure(args.model, pp, microbatches, prompts, args.output_len, args.overrides, args.partition)
        tokens = row.pop("token_ids")
        first.setdefault(pp, tokens)
        print({**row, "same_tokens_as_first_run_of_this_pp": tokens == first[pp]}, flush=True)


if __name__ == "__main__":
    main()

"""Long generations under a small KV cache, with and without freeing the blocks
that fell out of a sliding window.

A Mistral-shaped model (window on every layer) generates ``--max-tokens`` tokens
for each of ``--num-requests`` requests in a cache of ``--num-blocks`` blocks.
Without freeing, a request holds every block of its sequence, so few run at once
and the scheduler preempts; with it, a request holds only its window's blocks.
The run "without" is the same engine with the KV-cache manager's window unset.
Both runs must produce the same greedy tokens.

    OMP_NUM_THREADS=1 python benchmarks/sliding_window_blocks.py --tokenizer <tokenizer dir>
"""

from __future__ import annotations

import argparse
import json
import random
import time

from minivllm import LLM, SamplingParams

SMALL_MISTRAL = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": 512,
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mistral-7b", help="preset name or checkpoint directory")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (defaults to the model's)")
    p.add_argument("--hf-overrides", default=json.dumps(SMALL_MISTRAL), help="JSON merged into config.json")
    p.add_argument("--window", type=int, default=64, help="sliding_window of every layer")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=96)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    return p.parse_args()


def run(args: argparse.Namespace, free_out_of_window: bool) -> dict:
    overrides = {**json.loads(args.hf_overrides), "sliding_window": args.window}
    llm = LLM(
        model=args.model,
        tokenizer=args.tokenizer,
        load_format="dummy",
        hf_overrides=overrides,
        dtype="float32",
        block_size=args.block_size,
        num_gpu_blocks_override=args.num_blocks,
        max_model_len=1024,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.num_requests,
    )
    scheduler = llm.llm_engine.core.scheduler
    if not free_out_of_window:
        scheduler.kv.sliding_window = None
    rng = random.Random(0)
    vocab = llm.cfg.hf_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for i in range(args.num_requests):
        prompt = {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(args.prompt_len)]}
        llm.llm_engine.add_request(str(i), prompt, params)
    outputs, steps, running, start = {}, 0, [], time.perf_counter()
    while llm.llm_engine.has_unfinished_requests():
        for out in llm.llm_engine.step():
            outputs[out.request_id] = out.outputs[0].token_ids
        steps += 1
        running.append(len(scheduler.running))
    seconds = time.perf_counter() - start
    llm.shutdown()
    return {
        "seconds": seconds,
        "steps": steps,
        "preemptions": scheduler.num_preemptions,
        "mean_running": sum(running) / len(running),
        "max_running": max(running),
        "out_tok_s": args.num_requests * args.max_tokens / seconds,
        "tokens": outputs,
    }


def main() -> None:
    args = parse_args()
    results = {free: run(args, free) for free in (False, True)}
    assert results[False]["tokens"] == results[True]["tokens"], "greedy outputs differ"
    print("| freeing | seconds | steps | output tok/s | preemptions | mean running | max running |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for free, r in results.items():
        print(
            f"| {'on' if free else 'off'} | {r['seconds']:.2f} | {r['steps']} | {r['out_tok_s']:.1f} "
            f"| {r['preemptions']} | {r['mean_running']:.1f} | {r['max_running']} |"
        )


if __name__ == "__main__":
    main()

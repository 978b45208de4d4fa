"""Single-request decode speed with and without speculative decoding.

One request at a time, greedy, on the same engine settings; the only
difference is ``speculative_config``. Two prompts: code whose lines repeat
(prompt lookup finds its drafts) and a prompt with no repetition. Reports
output tokens per second, the speed-up, the acceptance rate and the mean
accepted length (tokens per verification step, the target's own included),
and checks that the outputs are identical.

    OMP_NUM_THREADS=1 python benchmarks/spec_decode.py --model demo --max-tokens 128 --repeat 3
"""
from __future__ import annotations

import argparse
import json
import time

from minivllm import LLM, SamplingParams

PROMPTS = {
    "repetitive code": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, item):\n        self.items.append(item)\n\n"
        "    def pop(self):\n        return self.items.pop()\n\n"
        "class Queue:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, item):\n"
    ),
    "plain": "def fibonacci(n):\n",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting; the best is reported")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=5)
    return parser.parse_args()


def measure(llm: LLM, prompt: str, max_tokens: int, repeat: int) -> tuple[float, list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    best, tokens = float("inf"), []
    for _ in range(repeat):
        start = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        best = min(best, time.perf_counter() - start)
        tokens = out.token_ids
    return len(tokens) / best, tokens


def main() -> None:
    args = parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
            "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max}
    plain_llm = LLM(args.model, dtype=args.dtype)
    spec_llm = LLM(args.model, dtype=args.dtype, speculative_config=spec)
    rows = []
    for name, prompt in PROMPTS.items():
        plain_tps, plain_tokens = measure(plain_llm, prompt, args.max_tokens, args.repeat)
        before = spec_llm.llm_engine.get_stats().spec_decoding
        spec_tps, spec_tokens = measure(spec_llm, prompt, args.max_tokens, args.repeat)
        after = spec_llm.llm_engine.get_stats().spec_decoding
        drafts = after.num_drafts - before.num_drafts
        proposed = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        rows.append({
            "prompt": name,
            "plain_tok_s": round(plain_tps, 1),
            "ngram_tok_s": round(spec_tps, 1),
            "speedup": round(spec_tps / plain_tps, 2),
            "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
            "mean_accepted_length": round(1 + accepted / drafts, 2) if drafts else 0.0,
            "identical_output": plain_tokens == spec_tokens,
        })
    print("| prompt | plain tok/s | ngram tok/s | speed-up | acceptance rate | mean accepted length | same output |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['prompt']} | {r['plain_tok_s']} | {r['ngram_tok_s']} | {r['speedup']}x | "
              f"{100 * r['acceptance_rate']:.1f}% | {r['mean_accepted_length']} | {r['identical_output']} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

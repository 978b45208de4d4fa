"""Single-request decode speed with and without speculative decoding.

One request at a time, greedy, on the same engine settings; the only
difference is ``speculative_config``. Two prompts: code whose lines repeat
(prompt lookup finds its drafts) and a prompt with no repetition. Per method
(``--methods``: ngram, draft_model, eagle) it reports output tokens per second,
the speed-up, the acceptance rate and the mean accepted length (tokens per
verification step, the target's own included), and checks that the outputs
are identical. The draft model defaults to the demo model's first two layers
(``tools/cut_draft_model.py``), the EAGLE head to a random one
(``tools/make_eagle_head.py``: it shows the method's cost, not its acceptance),
both written to a temporary directory.

    OMP_NUM_THREADS=1 python benchmarks/spec_decode.py --model demo --max-tokens 128 --repeat 3
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.config.store import ASSETS_DIR
from tools.cut_draft_model import cut_layers
from tools.make_eagle_head import make_eagle_head

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
    parser.add_argument("--methods", default="ngram,draft_model,eagle", help="comma-separated")
    parser.add_argument("--draft", default=None, help="draft checkpoint (default: the demo model cut to 2 layers)")
    parser.add_argument("--eagle-head", default=None, help="EAGLE head (default: a random one for the demo model)")
    return parser.parse_args()


def spec_config(method: str, args: argparse.Namespace, tmp: Path) -> dict:
    config = {"method": method, "num_speculative_tokens": args.num_speculative_tokens}
    if method == "ngram":
        return {**config, "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max}
    if method == "eagle":
        return {**config, "model": args.eagle_head or str(make_eagle_head(ASSETS_DIR / "demo-llama", tmp / "eagle"))}
    draft = args.draft or str(cut_layers(ASSETS_DIR / "demo-llama", tmp / "demo-draft", 2))
    return {**config, "model": draft}


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
    plain_llm = LLM(args.model, dtype=args.dtype)
    plain = {name: measure(plain_llm, prompt, args.max_tokens, args.repeat) for name, prompt in PROMPTS.items()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            spec_llm = LLM(args.model, dtype=args.dtype, speculative_config=spec_config(method, args, Path(tmp)))
            for name, prompt in PROMPTS.items():
                rows.append(measure_spec(spec_llm, method, name, prompt, plain[name], args))
            spec_llm.shutdown()
    print("| method | prompt | plain tok/s | spec tok/s | speed-up | acceptance rate | mean accepted length "
          "| same output |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['method']} | {r['prompt']} | {r['plain_tok_s']} | {r['spec_tok_s']} | {r['speedup']}x | "
              f"{100 * r['acceptance_rate']:.1f}% | {r['mean_accepted_length']} | {r['identical_output']} |")
    print(json.dumps(rows))


def measure_spec(llm: LLM, method: str, name: str, prompt: str, plain: tuple, args: argparse.Namespace) -> dict:
    plain_tps, plain_tokens = plain
    before = llm.llm_engine.get_stats().spec_decoding
    spec_tps, spec_tokens = measure(llm, prompt, args.max_tokens, args.repeat)
    after = llm.llm_engine.get_stats().spec_decoding
    drafts = after.num_drafts - before.num_drafts
    proposed = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    return {
        "method": method,
        "prompt": name,
        "plain_tok_s": round(plain_tps, 1),
        "spec_tok_s": round(spec_tps, 1),
        "speedup": round(spec_tps / plain_tps, 2),
        "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
        "mean_accepted_length": round(1 + accepted / drafts, 2) if drafts else 0.0,
        "identical_output": plain_tokens == spec_tokens,
    }


if __name__ == "__main__":
    main()

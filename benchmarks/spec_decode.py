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


def timed(llm: LLM, prompt: str, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds for one greedy request, and its tokens."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    return time.perf_counter() - start, list(out.token_ids)


def main() -> None:
    """Every engine is built first; then each repeat runs every (prompt, engine) once, so
    load from other jobs on the machine falls on all settings alike. Best of the repeats."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"plain": LLM(args.model, dtype=args.dtype)}
        for method in args.methods.split(","):
            engines[method] = LLM(args.model, dtype=args.dtype, speculative_config=spec_config(method, args, Path(tmp)))
    for llm in engines.values():
        llm.generate(["warm up"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    best = {(name, e): (float("inf"), []) for name in PROMPTS for e in engines}
    counts = {(name, e): [0, 0, 0] for name in PROMPTS for e in engines}  # drafts, proposed, accepted
    for _ in range(args.repeat):
        for name, prompt in PROMPTS.items():
            for e, llm in engines.items():
                before = llm.llm_engine.get_stats().spec_decoding
                seconds, tokens = timed(llm, prompt, args.max_tokens)
                best[name, e] = min(best[name, e], (seconds, tokens), key=lambda t: t[0])
                after = llm.llm_engine.get_stats().spec_decoding
                if after is not None:
                    counts[name, e][0] += after.num_drafts - before.num_drafts
                    counts[name, e][1] += after.num_draft_tokens - before.num_draft_tokens
                    counts[name, e][2] += after.num_accepted_tokens - before.num_accepted_tokens
    methods = [e for e in engines if e != "plain"]
    rows = [row(e, name, best[name, "plain"], best[name, e], counts[name, e]) for e in methods for name in PROMPTS]
    print(
        "| method | prompt | plain tok/s | spec tok/s | speed-up | acceptance rate | mean accepted length "
        "| same output |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['method']} | {r['prompt']} | {r['plain_tok_s']} | {r['spec_tok_s']} | {r['speedup']}x | "
            f"{100 * r['acceptance_rate']:.1f}% | {r['mean_accepted_length']} | {r['identical_output']} |"
        )
    print(json.dumps(rows))


def row(method: str, name: str, plain: tuple, spec: tuple, counts: list[int]) -> dict:
    drafts, proposed, accepted = counts
    plain_tps, spec_tps = len(plain[1]) / plain[0], len(spec[1]) / spec[0]
    return {
        "method": method,
        "prompt": name,
        "plain_tok_s": round(plain_tps, 1),
        "spec_tok_s": round(spec_tps, 1),
        "speedup": round(spec_tps / plain_tps, 2),
        "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
        "mean_accepted_length": round(1 + accepted / drafts, 2) if drafts else 0.0,
        "identical_output": plain[1] == spec[1],
    }


if __name__ == "__main__":
    main()

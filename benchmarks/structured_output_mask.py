"""Per-step cost of structured outputs, at batch 1 and 64.

1. Libraries: grammar mask filling, matcher advance and the bitmask applied to
   the logits, for xgrammar and llguidance. Each of the batch's matchers follows
   the tokens of one valid JSON document for a schema with nested objects,
   arrays and enums, so every step does real matcher work.
2. Engine (``--engine``): the demo model generating JSON for that schema through
   ``LLM.generate``; the time spent in the engine's structured-output work
   (bitmask filling in the scheduler, matcher advance, the bitmask in the
   sampler) per step, against the whole step.

    OMP_NUM_THREADS=1 python benchmarks/structured_output_mask.py [--tokenizer DIR] [--engine]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

DEMO = Path(__file__).resolve().parents[1] / "minivllm" / "assets" / "demo-llama"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "role": "admin",
    "tags": ["math", "engines"],
    "address": {"city": "London", "zip": "W1"},
}


def bench_xgrammar(tok, vocab: int, token_ids: list[int], batch: int) -> tuple[float, float]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    t0 = time.perf_counter()
    grammar = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    compile_s = time.perf_counter() - t0
    matchers = [xgr.GrammarMatcher(grammar) for _ in range(batch)]
    bitmask = xgr.allocate_token_bitmask(batch, vocab)

    def step(token: int) -> None:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)
        for m in matchers:
            assert m.accept_token(token)

    return compile_s, _time_steps(step, token_ids, bitmask, vocab, batch)


def bench_llguidance(tok, vocab: int, token_ids: list[int], batch: int) -> tuple[float, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]
    compile_s = time.perf_counter() - t0
    bitmask = llguidance.torch.allocate_token_bitmask(batch, vocab)

    def step(token: int) -> None:
        for i, m in enumerate(matchers):
            llguidance.torch.fill_next_token_bitmask(m, bitmask, i)
        for m in matchers:
            assert m.consume_token(token), m.get_error()

    return compile_s, _time_steps(step, token_ids, bitmask, vocab, batch)


def _time_steps(step, token_ids: list[int], bitmask: torch.Tensor, vocab: int, batch: int) -> float:
    """Mean seconds per step: fill every row's mask, advance every matcher, mask the logits."""
    import xgrammar as xgr

    logits = torch.randn(batch, vocab)
    start = time.perf_counter()
    for token in token_ids:
        step(token)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
    return (time.perf_counter() - start) / len(token_ids)


class _Clock:
    """Wraps functions to add up the seconds spent in them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, owner, name: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, timed)


def bench_engine(batches: list[int]) -> None:
    from minivllm import LLM, SamplingParams
    from minivllm.sample import sampler as sampler_module
    from minivllm.structured_output import StructuredOutputsParams
    from minivllm.structured_output.manager import StructuredOutputManager

    clock = _Clock()
    clock.wrap(StructuredOutputManager, "fill_bitmask")
    clock.wrap(StructuredOutputManager, "accept_tokens")
    clock.wrap(sampler_module, "apply_grammar_bitmask")
    llm = LLM(str(DEMO), dtype="float32", device="cpu", block_size=16, num_gpu_blocks_override=2048, max_num_seqs=64)
    print("| batch | steps | step (ms) | structured-output work per step (ms) | share |")
    print("| --- | --- | --- | --- | --- |")
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    for batch in batches:
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=64, structured_outputs=so) for i in range(batch)]
        llm.generate(["Warm up"], params[0], use_tqdm=False)
        clock.seconds = 0.0
        count = 0
        original = llm.llm_engine.step

        def counted(original=original):
            nonlocal count
            count += 1
            return original()

        llm.llm_engine.step = counted
        start = time.perf_counter()
        llm.generate([f"Person {i}:" for i in range(batch)], params, use_tqdm=False)
        total = time.perf_counter() - start
        llm.llm_engine.step = original
        print(
            f"| {batch} | {count} | {total / count * 1e3:.2f} | {clock.seconds / count * 1e3:.3f} | "
            f"{clock.seconds / total * 100:.1f}% |"
        )
    llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(DEMO))
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--engine", action="store_true", help="also measure inside the engine (demo model)")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = len(tok)
    token_ids = tok.encode(json.dumps(DOCUMENT, separators=(",", ":")), add_special_tokens=False)
    print(f"tokenizer {args.tokenizer}: vocab {vocab}; document: {len(token_ids)} tokens")
    print("| library | batch | compile (ms) | per step (ms) | per token (us) |")
    print("| --- | --- | --- | --- | --- |")
    for batch in [int(b) for b in args.batches.split(",")]:
        for name, fn in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            compile_s, step_s = fn(tok, vocab, token_ids, batch)
            print(f"| {name} | {batch} | {compile_s * 1e3:.1f} | {step_s * 1e3:.3f} | {step_s / batch * 1e6:.1f} |")
    if args.engine:
        bench_engine([int(b) for b in args.batches.split(",")])


if __name__ == "__main__":
    main()

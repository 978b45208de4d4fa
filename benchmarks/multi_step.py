"""What multi-step decoding (``scheduler.num_scheduler_steps``) saves, measured in one run.

For each concurrency and each step count, one engine decodes N requests (short random
prompts, ``--output-len`` tokens each, greedy, EOS ignored, outputs asked for as
``LLM.generate`` does), after a warm-up run of the same shape. Only the decode phase is
timed: from the step where every request has its first token to the last. Printed per
row: decode output tok/s (wall), engine steps, and the engine thread's CPU ms per output
token (what the host spends, scheduling to detokenizing, beside the model); the last
column is tok/s against the same concurrency's one-step row::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/multi_step.py [--model DIR] [--concurrency 1 64] [--steps 1 4 8]

Without ``--model`` the model is a 1-layer, hidden-32 Llama with dummy weights, so a step
is the engine's host path alone: the upper bound of what the option saves. With a real
checkpoint (``--model``) the model's own time is in every step and the gain shrinks to
the host path's share.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from host_overhead import TINY  # the same host-path model (run as a script, this folder is on sys.path)

from minivllm import RequestOutputKind, SamplingParams
from minivllm.config.store import build_config
from minivllm.engine.llm_engine import LLMEngine


def build_engine(model: str | None, concurrency: int, steps: int, overrides: list[str]) -> LLMEngine:
    if model is None:
        tiny = ",".join(f"{k}:{v}" for k, v in TINY.items())
        model_keys = ["load.format=dummy", f"+model.hf_overrides={{{tiny}}}"]
    else:
        model_keys = [f"model.path={model}"]
    cfg = build_config(
        overrides=[
            *model_keys,
            "model.dtype=float32",
            f"scheduler.max_num_seqs={concurrency}",
            "scheduler.log_stats_interval=0",
            f"scheduler.num_scheduler_steps={steps}",
            *overrides,
        ]
    )
    return LLMEngine(cfg)


def decode(engine: LLMEngine, concurrency: int, output_len: int, seed: int) -> dict[str, float]:
    """One run: the decode phase's wall seconds, CPU seconds, engine steps and output tokens."""
    rng = np.random.default_rng(seed)
    vocab = engine.cfg.hf_text_config.vocab_size
    params = SamplingParams(
        temperature=0, max_tokens=output_len, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    for i in range(concurrency):
        prompt = rng.integers(3, vocab, size=int(rng.integers(8, 32))).tolist()
        engine.add_request(f"{seed}-{i}", {"prompt_token_ids": prompt}, params)
    while engine.core.scheduler.waiting or any(not r.output_token_ids for r in engine.core.scheduler.running):
        engine.step()  # the prefills, until every request has its first token
    first = engine.core.num_generated_tokens
    wall, cpu, steps = time.perf_counter(), time.thread_time(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.thread_time() - cpu,
        "steps": steps,
        "tokens": engine.core.num_generated_tokens - first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint directory (default: the tiny dummy model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per row; the fastest is reported")
    parser.add_argument("overrides", nargs="*", help="extra config overrides, e.g. scheduler.async_scheduling=true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"{'requests':>8} {'steps':>5} {'tok/s':>9} {'engine steps':>12} {'CPU ms/token':>12} {'vs 1 step':>9}")
    for n in args.concurrency:
        base = None
        for steps in args.steps:
            engine = build_engine(args.model, n, steps, args.overrides)
            decode(engine, n, args.output_len, seed=0)  # warm-up
            runs = [decode(engine, n, args.output_len, seed=1 + r) for r in range(args.repeat)]
            engine.shutdown()
            best = min(runs, key=lambda r: r["wall"] / r["tokens"])
            tok_s = best["tokens"] / best["wall"]
            base = tok_s if base is None else base
            print(
                f"{n:>8} {steps:>5} {tok_s:>9.1f} {best['steps']:>12} "
                f"{1e3 * best['cpu'] / best['tokens']:>12.3f} {tok_s / base:>8.2f}x"
            )


if __name__ == "__main__":
    main()

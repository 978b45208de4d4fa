"""Where the CPU time of one batched run goes, in minivllm and in vLLM's CPU build: a torch.profiler
(CPU) table of the same requests through either engine.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/cpu_peer_profile.py --engine minivllm --model $CKPT
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=0 OMP_NUM_THREADS=1 \
        /path/to/vllm-venv/bin/python benchmarks/cpu_peer_profile.py --engine vllm --model $CKPT

The script imports only the standard library, torch and the engine it runs (vLLM runs from its own
virtual environment, as ``bench.baseline=vllm`` does; its engine core must run in this process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, for the profiler to see it). ``--num-prompts`` requests with
prompts and outputs uniform in [--min-len, --max-len] (random token ids from ``--seed``: the same
requests for both engines), greedy, ignore EOS. A warm-up run, the timed run and the profiled run
each get the same requests with the token ids renamed apart (``renamed``: the same lengths and shared
prefixes, so the same steps, but no run finds another's prompts in the prefix cache, which vLLM
and minivllm both keep); printed: the run's CPU seconds (without and with the profiler), the ops by self CPU
time, how many ops ran per engine step (``--step-op``: an op each engine calls once a step) and how
much of the run's CPU time the profiled ops account for (the rest is host Python).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def make_requests(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def renamed(requests: list[tuple[list[int], int]], vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """``requests`` with every distinct token id mapped to another one, the same everywhere."""
    rng = random.Random(seed)
    distinct = sorted({t for prompt, _ in requests for t in prompt})
    rename = dict(zip(distinct, rng.sample(range(3, vocab), len(distinct))))
    return [([rename[t] for t in prompt], n) for prompt, n in requests]


def build(engine: str, model: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """The engine's LLM and a function that generates the requests with it (token ids back)."""
    if engine == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=model,
            dtype=args.dtype,
            max_model_len=512,
            max_num_seqs=args.max_num_seqs,
            seed=0,
            kv_cache_memory_bytes=args.kv_bytes,
            skip_tokenizer_init=True,
        )
    else:
        from minivllm.entrypoints.llm import LLM
        from minivllm.sampling_params import SamplingParams

        llm = LLM(
            model,
            overrides=[
                "device=cpu",
                f"model.dtype={args.dtype}",
                "model.max_model_len=512",
                f"scheduler.max_num_seqs={args.max_num_seqs}",
                *args.overrides,
            ],
        )

    def run(requests: list[tuple[list[int], int]]) -> list[list[int]]:
        prompts = [{"prompt_token_ids": p} for p, _ in requests]
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=False) for _, m in requests]
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    return llm, run


def single_decode(run: Any, prompt: list[int], n: int, engine: str) -> None:
    """CPU ms per decode step of one request: (CPU of n tokens - CPU of 1 token) / (n - 1), median of 5."""

    def cpu(tokens: int) -> float:
        start = time.process_time()
        run([(prompt, tokens)])
        return time.process_time() - start

    cpu(n)  # warm-up
    steps = sorted((cpu(n) - cpu(1)) / (n - 1) for _ in range(5))
    print(
        f"{engine}: single request decode, CPU ms per step {[round(1e3 * s, 2) for s in steps]}, median {1e3 * steps[2]:.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("minivllm", "vllm"), required=True)
    p.add_argument("--model", required=True, help="checkpoint folder (the issue's: a Llama of hidden 768)")
    p.add_argument("--dtype", default="float32", help="both engines' model dtype")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--kv-bytes", type=int, default=512 << 20, help="vLLM's KV cache bytes")
    p.add_argument("--top", type=int, default=25, help="ops listed")
    p.add_argument("--step-op", help="an op called once per engine step (counts the steps)")
    p.add_argument("--json", help="also write the table here")
    p.add_argument(
        "--single", type=int, default=0, metavar="N",
        help="instead: one request of 32 prompt tokens decoding N tokens; CPU ms per decode step, median of 5",
    )  # fmt: skip
    p.add_argument("overrides", nargs="*", help="minivllm: Hydra overrides (after --)")
    args = p.parse_args()

    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    requests = make_requests(args.num_prompts, args.min_len, args.max_len, vocab, args.seed)
    _, run = build(args.engine, args.model, args)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {torch.backends.cpu.get_cpu_capability()}")
    if args.single:
        single_decode(run, requests[0][0][:32], args.single, args.engine)
        return
    run(renamed(requests, vocab, args.seed + 1))  # warm-up: the same shapes, other ids
    cpu0, wall0 = time.process_time(), time.perf_counter()
    tokens = run(requests)
    cpu_plain = time.process_time() - cpu0
    wall_plain = time.perf_counter() - wall0
    out_tokens = sum(map(len, tokens))
    cpu0 = time.process_time()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run(renamed(requests, vocab, args.seed + 2))
    cpu_prof = time.process_time() - cpu0

    events = prof.key_averages()
    total_self_us = sum(e.self_cpu_time_total for e in events)
    n_ops = sum(e.count for e in events if "::" in e.key)
    steps = next((e.count for e in events if args.step_op and e.key == args.step_op), 0)
    print(
        f"{args.engine}: {out_tokens} output tokens; CPU s {cpu_plain:.2f} (wall {wall_plain:.2f}); profiled {cpu_prof:.2f}"
    )
    print(f"profiled ops' self CPU: {total_self_us / 1e6:.2f} s of {cpu_prof:.2f} s; {n_ops} op calls", end="")
    print(f", {steps} steps, {n_ops / steps:.0f} op calls a step" if steps else "")
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
    print(f"{'op':60s} {'calls':>7s} {'self CPU s':>10s} {'%':>6s}")
    for e in rows:
        print(
            f"{e.key[:60]:60s} {e.count:7d} {e.self_cpu_time_total / 1e6:10.3f} {100 * e.self_cpu_time_total / total_self_us:6.1f}"
        )
    by_shape: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.key_averages(group_by_input_shape=True):
        if any(k in e.key for k in ("mm", "linear", "onednn", "mkl", "gemm")):
            key = f"{e.key} {e.input_shapes}"[:100]
            by_shape[key][0] += e.count
            by_shape[key][1] += e.self_cpu_time_total / 1e6
    print("GEMM-like ops by input shape (top 12):")
    for key, (count, s) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {count:6d} {s:8.3f} s  {key}")
    if args.json:
        json.dump(
            {
                "engine": args.engine,
                "cpu_s": cpu_plain,
                "cpu_s_profiled": cpu_prof,
                "ops_self_s": total_self_us / 1e6,
                "op_calls": n_ops,
                "steps": steps,
                "output_tokens": out_tokens,
                "top": [(e.key, e.count, e.self_cpu_time_total / 1e6) for e in rows],
            },
            open(args.json, "w"),
        )


if __name__ == "__main__":
    main()

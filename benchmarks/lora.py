"""The cost of serving LoRA adapters: one workload on the base model alone and spread over 1, 4 and 8 adapters.

Adapters (rank ``--rank`` on q/k/v/o and gate/up/down, random non-zero weights) are made
with peft on the demo checkpoint in a temporary folder. Requests take the adapters in
turn; ``max_loras`` equals the number of adapters, so no step waits for a slot and
nothing is evicted. Also runs ``enable_lora`` with no adapter requested (the cost of the
feature being on). Reports wall time and output tokens per second, best of ``--repeat``.

    OMP_NUM_THREADS=1 python benchmarks/lora.py --num-requests 32 --max-tokens 32
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.config.store import ASSETS_DIR
from minivllm.lora import LoRARequest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--adapters", default="1,4,8", help="adapter counts to run")
    p.add_argument("--repeat", type=int, default=2)
    return p.parse_args()


@torch.no_grad()
def make_adapters(base: Path, out: Path, count: int, rank: int) -> list[Path]:
    paths = []
    for i in range(count):
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
            LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS),
        )
        gen = torch.Generator().manual_seed(i)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[-1] ** 0.5))
        model.save_pretrained(out / f"a{i}")
        paths.append(out / f"a{i}")
    return paths


def run(llm: LLM, prompts: list, loras: list, params: SamplingParams, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    args = parse_args()
    base = ASSETS_DIR / "demo-llama"
    counts = [int(c) for c in args.adapters.split(",")]
    prompts = [
        {"prompt_token_ids": [(7 * i + j) % 2000 + 4 for j in range(args.prompt_len)]} for i in range(args.num_requests)
    ]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    total = args.num_requests * args.max_tokens
    common = dict(dtype="float32", device="cpu", max_num_seqs=args.num_requests, enable_prefix_caching=False)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_adapters(base, Path(tmp), max(counts), args.rank)
        rows = [("base model, lora off", run(LLM(str(base), **common), prompts, None, params, args.repeat))]
        for n in [0, *counts]:
            llm = LLM(str(base), enable_lora=True, max_loras=max(n, 1), max_lora_rank=args.rank, **common)
            loras = [LoRARequest(f"a{i % n}", i % n + 1, str(paths[i % n])) if n else None for i in range(len(prompts))]
            rows.append((f"lora on, {n} adapters", run(llm, prompts, loras, params, args.repeat)))
            llm.shutdown()
    base_time = rows[0][1]
    print(
        f"{args.num_requests} requests x ({args.prompt_len} prompt + {args.max_tokens} output tokens), rank {args.rank}"
    )
    print("| run | wall (s) | output tok/s | vs base |\n| --- | --- | --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t:.2f} | {total / t:.1f} | {t / base_time:.2f}x |")


if __name__ == "__main__":
    main()

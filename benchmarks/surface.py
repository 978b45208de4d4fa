"""Costs of the offline-API additions, each against its own baseline:

1. per-request ``logits_processors`` (row-by-row slow path) vs none, in one batch;
2. ``LLM.beam_search`` vs transformers' ``generate(num_beams=W)`` on the same prompts;
3. ``LLM.embed`` vs transformers' ``AutoModel`` forward (batched, same prompts).

The model is a Llama-shaped checkpoint built on the spot (random weights; the
tokenizer the tests train), so both libraries load the same files:

    OMP_NUM_THREADS=1 python benchmarks/surface.py --hidden-size 256 --layers 4
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import BeamSearchParams
from tests import checkpoints as ck
from tests.model_configs import llama_config


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--beam-width", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="runs per logits-processor setting (median shown)")
    return p.parse_args()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def build_checkpoint(args: argparse.Namespace, root: Path) -> Path:
    ck.train_tokenizer(root / "tok")
    config = llama_config(
        hidden_size=args.hidden_size,
        intermediate_size=4 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    return ck.save_checkpoint(config, root / "ckpt", root / "tok")


def bench_logits_processors(path: Path, prompts: list[list[int]], args: argparse.Namespace) -> None:
    llm = LLM(str(path), dtype="float32", disable_log_stats=True, num_gpu_blocks_override=2048)
    identity = lambda ids, logits: logits  # noqa: E731
    base = dict(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], SamplingParams(**base), use_tqdm=False)  # warm-up
    counts = (0, 1, len(prompts))
    runs: dict[int, list[float]] = {c: [] for c in counts}
    for _ in range(args.repeats):  # interleaved, so a busy machine slows every setting alike
        for with_proc in counts:
            params = [
                SamplingParams(**base, logits_processors=[identity] if i < with_proc else None)
                for i in range(len(prompts))
            ]
            llm.reset_prefix_cache()
            _, secs = timed(
                lambda params=params: llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            )
            runs[with_proc].append(secs)
    print(f"| requests with a logits processor | median seconds of {args.repeats} | output tok/s |")
    print("| --- | ---: | ---: |")
    for with_proc in counts:
        secs = statistics.median(runs[with_proc])
        print(f"| {with_proc} of {len(prompts)} | {secs:.2f} | {len(prompts) * args.max_tokens / secs:.1f} |")
    llm.shutdown()


def bench_beam_search(path: Path, prompts: list[list[int]], args: argparse.Namespace) -> None:
    llm = LLM(str(path), dtype="float32", disable_log_stats=True, num_gpu_blocks_override=2048)
    params = BeamSearchParams(beam_width=args.beam_width, max_tokens=args.max_tokens, ignore_eos=True)
    some = prompts[:8]
    ours, secs = timed(lambda: llm.beam_search([{"prompt_token_ids": p} for p in some], params))
    hit = llm.llm_engine.get_stats().prefix_cache_hit_rate
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref, hf_secs = timed(
            lambda: hf.generate(
                torch.tensor(some),
                attention_mask=torch.ones(len(some), len(some[0]), dtype=torch.long),
                num_beams=args.beam_width,
                do_sample=False,
                max_new_tokens=args.max_tokens,
                min_new_tokens=args.max_tokens,
                pad_token_id=0,
            )
        )
    same = sum(o.sequences[0].tokens == r for o, r in zip(ours, ref.tolist()))
    print(
        f"\nbeam search, {len(some)} prompts x {args.prompt_len} tokens, width {args.beam_width}, "
        f"{args.max_tokens} new tokens: minivllm {secs:.2f} s (prefix-cache hit rate {100 * hit:.1f}%), "
        f"transformers (batched) {hf_secs:.2f} s; best sequences equal: {same}/{len(some)}"
    )
    llm.shutdown()


def bench_embed(path: Path, prompts: list[list[int]]) -> None:
    llm = LLM(str(path), runner="pooling", dtype="float32", disable_log_stats=True, num_gpu_blocks_override=2048)
    llm.embed([{"prompt_token_ids": p} for p in prompts[:4]], use_tqdm=False)  # warm-up
    llm.reset_prefix_cache()
    outs, secs = timed(lambda: llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False))
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden, hf_secs = timed(lambda: hf(torch.tensor(prompts)).last_hidden_state)
    ref = torch.nn.functional.normalize(hidden[:, -1], dim=-1)
    err = max((torch.tensor(o.outputs.embedding) - r).abs().max().item() for o, r in zip(outs, ref))
    print(
        f"\nembeddings, {len(prompts)} prompts x {len(prompts[0])} tokens (LAST, normalized): minivllm {secs:.2f} s "
        f"({len(prompts) / secs:.1f} prompts/s), transformers AutoModel (one batch) {hf_secs:.2f} s "
        f"({len(prompts) / hf_secs:.1f} prompts/s); max abs difference {err:.1e}"
    )
    llm.shutdown()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(args, Path(tmp))
        prompts = [[rng.randrange(4, 512) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
        bench_logits_processors(path, prompts, args)
        bench_beam_search(path, prompts, args)
        bench_embed(path, prompts)


if __name__ == "__main__":
    main()

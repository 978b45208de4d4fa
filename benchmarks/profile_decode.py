"""A torch.profiler trace of full-batch decode steps, summarized as the top kernels
by time in groups (attention, GEMM, sampler, small ops, copies).

    PYTHONPATH=. python benchmarks/profile_decode.py                  # CUDA: Qwen3-0.6B shape, dummy bf16 weights
    PYTHONPATH=. python benchmarks/profile_decode.py --eager          # without CUDA graphs
    PYTHONPATH=. python benchmarks/profile_decode.py --tiny           # CPU: a 2-layer shape of the same model
    PYTHONPATH=. python benchmarks/profile_decode.py --json out.json -- cache.block_size=16

The engine is configured like ``task=bench bench=nanovllm`` (the overrides after
``--`` are added). ``--batch`` requests of ``--context`` random prompt tokens are
prefilled until every one of them decodes in the same step; after
``--warmup-steps`` such steps, ``--steps`` are timed without the profiler (the
step time reported), then the same number are profiled. The sampler runs inside
a ``record_function`` range so its kernels are told apart
(``minivllm/bench/kernel_groups.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from minivllm.bench.kernel_groups import SAMPLER_RANGE, cpu_ops, device_kernels, format_summary, summarize
from minivllm.bench.timing import StepTimer
from minivllm.config.store import build_config
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams

ENGINE = ["bench=nanovllm", "model=qwen3-0.6b", "load.format=dummy"]
FULL = dict(batch=256, context=512, steps=10, warmup_steps=3)
TINY = dict(batch=4, context=16, steps=3, warmup_steps=1)
TINY_SHAPE = [
    f"+model.hf_overrides.{k}={v}"
    for k, v in dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        vocab_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ).items()
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, help="requests decoding together (256; --tiny: 4)")
    p.add_argument("--context", type=int, help="prompt tokens of each request (512; --tiny: 16)")
    p.add_argument("--steps", type=int, help="decode steps timed, then profiled (10; --tiny: 3)")
    p.add_argument("--warmup-steps", type=int, help="full-batch decode steps before timing (3; --tiny: 1)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (nano-vllm's bench: 0.6)")
    p.add_argument("--eager", action="store_true", help="compilation.cudagraph=false")
    p.add_argument("--top", type=int, default=15, help="kernels listed")
    p.add_argument("--tiny", action="store_true", help="CPU: a 2-layer shape of the model, smaller defaults")
    p.add_argument("--json", metavar="PATH", help="also write the summary here")
    p.add_argument("overrides", nargs="*", help="Hydra overrides added to the engine's config (after --)")
    args = p.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tiny:
        args.overrides = ["device=cpu", *TINY_SHAPE, *args.overrides]
    if args.eager:
        args.overrides.append("compilation.cudagraph=false")
    return args


class _Ranged:
    """Calls ``inner`` inside a profiler range (the profiler tells the sampler's kernels apart by it)."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(self.name):
            return self.inner(*args, **kwargs)


def fill_batch(llm: LLM, args: argparse.Namespace) -> int:
    """Queue the requests and step until all of them decode in one step; returns the prefill steps."""
    engine, cfg = llm.llm_engine, llm.cfg
    rng = np.random.default_rng(0)
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.warmup_steps + 2 * args.steps + 64,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    for _ in range(args.batch):
        ids = rng.integers(0, cfg.hf_config.vocab_size, size=args.context).tolist()
        engine.add_request(None, {"prompt_token_ids": ids}, params)
    timer = StepTimer(engine.core.executor, None, torch.device(cfg.device_type)).attach()
    try:
        for step in range(1, 10_000):
            timer.run_step(engine.step)
            last = timer.steps[-1]
            if last.decode_only and last.num_reqs == args.batch:
                return step
            if not engine.has_unfinished_requests():
                break
    finally:
        timer.detach()
    raise RuntimeError(
        f"the {args.batch} requests never decoded in one step: raise scheduler.max_num_seqs or the KV cache"
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    engine, device = llm.llm_engine, torch.device(llm.cfg.device_type)
    runner = engine.core.executor.worker.model_runner
    prefill_steps = fill_batch(llm, args)
    for _ in range(args.warmup_steps):
        engine.step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    _sync(device)
    step_s = (time.perf_counter() - start) / args.steps
    runner.sampler = _Ranged(runner.sampler, SAMPLER_RANGE)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        _sync(device)
    runner.sampler = runner.sampler.inner
    events = prof.events()
    kernels = device_kernels(events) if device.type == "cuda" else cpu_ops(events)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "kernels_from": "device" if device.type == "cuda" else "cpu ops (self time)",
        "cudagraph": bool(runner.cuda_graphs is not None),
        "cudagraph_sizes": len(runner.cuda_graphs.sizes) if runner.cuda_graphs is not None else 0,
        "cudagraph_capture_s": runner.cuda_graphs.capture_s if runner.cuda_graphs is not None else 0.0,
        "cudagraph_memory_mib": runner.cuda_graphs.memory_bytes / 2**20 if runner.cuda_graphs is not None else 0.0,
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
        "prefill_steps": prefill_steps,
        "step_ms": 1e3 * step_s,
        "decode_tokens_per_s": args.batch / step_s,
        **summarize(kernels, args.steps, args.top),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = build_config([*ENGINE, *args.overrides])
    if args.batch > cfg.scheduler.max_num_seqs:
        print(f"--batch {args.batch}: more than scheduler.max_num_seqs={cfg.scheduler.max_num_seqs}", file=sys.stderr)
        return 2
    llm = LLM.from_config(cfg)
    try:
        summary = profile(llm, args)
    finally:
        llm.shutdown()
    print(
        f"{summary['device']}: {args.batch} requests x {args.context} context, cudagraph {summary['cudagraph']}; "
        f"step {summary['step_ms']:.2f} ms ({summary['decode_tokens_per_s']:.0f} tok/s) unprofiled, "
        f"kernels {summary['kernel_ms_per_step']:.2f} ms/step profiled"
    )
    if summary["cudagraph"]:
        print(
            f"CUDA graphs: {summary['cudagraph_sizes']} sizes captured in {summary['cudagraph_capture_s']:.2f} s, "
            f"{summary['cudagraph_memory_mib']:.1f} MiB"
        )
    print(format_summary(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

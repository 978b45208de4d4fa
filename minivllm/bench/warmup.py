"""The warm-up before a timed run, shared by the throughput (run.py) and serving (replay.py) benchmarks."""

from __future__ import annotations

from typing import Any

import numpy as np

from minivllm.bench.images import placeholder_token_ids, random_image
from minivllm.bench.step_timer import StepTimer
from minivllm.bench.workloads import BenchRequest, random_ids
from minivllm.config.vllm_config import VllmConfig
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams


def warm_up(llm: LLM, request: BenchRequest, cfg: VllmConfig, timer: StepTimer) -> int:
    """Run every kind of step the timed run will, once, so one-time costs (Triton compiling
    each kernel variant, allocator growth, torch.compile's shapes) stay out of the timings:
    a short prefill, a decode, a prefill chunk mixed with decodes, and a step at the full
    token budget over many sequences (the shape of the timed run's first steps).
    With images (``request.images``), one request with other images of the same size warms the
    vision encoder (the timed requests' images are not processed or cached by it).
    Returns the most tokens one warm-up step scheduled (the timer is reset afterwards)."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    exclude = placeholder_token_ids(cfg)
    prompt = [t for t in request.prompt_token_ids if t not in exclude]
    if request.images:
        rng = np.random.default_rng(cfg.bench.seed + 3)
        images = [random_image(im.width, rng) for im in request.images]
        warm = BenchRequest(request.prompt_token_ids, 8, tuple(images))
        engine.add_request("warmup-images", warm.prompt, params)
        while engine.has_unfinished_requests():
            timer.run_step(engine.step)
    engine.add_request("warmup-0", {"prompt_token_ids": prompt[:16]}, params)
    timer.run_step(engine.step)  # prefill
    timer.run_step(engine.step)  # decode
    engine.add_request("warmup-1", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():  # mixed prefill + decode, then decodes of two
        timer.run_step(engine.step)
    kv_tokens = engine.scheduler_stats().num_blocks * cfg.cache.block_size
    for i, ids in enumerate(budget_prompts(cfg, len(prompt), kv_tokens)):
        engine.add_request(f"warmup-budget-{i}", {"prompt_token_ids": ids}, params)
    while engine.has_unfinished_requests():
        timer.run_step(engine.step)
    most = max(s.num_tokens for s in timer.steps)
    timer.reset()
    return most


def budget_prompts(cfg: VllmConfig, length: int, kv_tokens: int) -> list[list[int]]:
    """Random prompts (no prefix-cache hits with the timed ones), enough of them to fill one
    step's token budget within the sequence limit, all of them fitting the KV cache at once."""
    sched = cfg.scheduler
    budget = min(sched.max_num_batched_tokens, kv_tokens // 2)
    length = min(max(length, -(-budget // sched.max_num_seqs)), cfg.max_model_len - 8, budget)
    count = min(sched.max_num_seqs, -(-budget // max(1, length)))
    rng = np.random.default_rng(cfg.bench.seed + 2)
    vocab_size, exclude = cfg.hf_text_config.vocab_size, placeholder_token_ids(cfg)
    return [random_ids(length, vocab_size, rng, exclude) for _ in range(count)]


def model_runner(llm: LLM) -> Any | None:
    worker = getattr(llm.llm_engine.core.executor, "worker", None)
    return getattr(worker, "model_runner", None)

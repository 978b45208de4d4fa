"""task=bench with KV beyond the device: multi-turn chat whose prefixes exceed the device
cache, with and without the host-memory tier (``bench=offload``).

``bench.workload=multi_turn``: ``bench.num_prompts`` conversations, each with a system
prompt of its own (``bench.prefix_len`` random tokens), take turns round-robin for
``bench.turns`` rounds; every turn sends the whole conversation so far plus a new
``bench.max_input_len``-token message and generates ``bench.max_output_len`` tokens
(greedy, EOS ignored). One turn runs at a time, so its TTFT is its prefill, no queueing.
With ``cache.kv_offloading_size`` set the engine runs four times in this process,
alternating off, on, on, off (same device cache, same turns), and the report gives each
run's hit rate (prompt tokens not computed / prompt tokens), device and host hits, TTFT
and whether every run generated the same tokens; without it, once, off.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import numpy as np

from minivllm.bench.workloads import random_ids
from minivllm.config.vllm_config import VllmConfig
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


def bench_multi_turn(cfg: VllmConfig) -> dict[str, Any]:
    """The runs (off, or off/on/on/off) and the TTFT ratio; every run's greedy tokens compared."""
    size = cfg.cache.kv_offloading_size
    runs = [_run_chat(cfg, None)] if size is None else [_run_chat(cfg, s) for s in (None, size, size, None)]
    outputs = runs[0].pop("outputs")
    same = all(r.pop("outputs", outputs) == outputs for r in runs[1:])
    out: dict[str, Any] = {"runs": runs, "identical_outputs": same}
    on = [r["mean_ttft_ms"] for r in runs if r["offload_gib"]]
    if on:
        off = [r["mean_ttft_ms"] for r in runs if not r["offload_gib"]]
        out["mean_ttft_off_over_on"] = statistics.mean(off) / statistics.mean(on)
    return out


def _run_chat(cfg: VllmConfig, offload_gib: float | None) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    cfg.cache.kv_offloading_size = offload_gib
    cfg.kv_transfer.kv_connector = "OffloadingConnector" if offload_gib else None
    bench = cfg.bench
    llm = LLM.from_config(cfg)
    try:
        rng = np.random.default_rng(bench.seed)
        vocab = cfg.hf_text_config.vocab_size
        params = SamplingParams(temperature=0.0, max_tokens=bench.max_output_len, ignore_eos=True)
        llm.generate([{"prompt_token_ids": random_ids(64, vocab, rng)}], params, use_tqdm=False)  # warm-up
        histories = [random_ids(bench.prefix_len, vocab, rng) for _ in range(bench.num_prompts)]
        ttfts, outputs, prompt_tokens, cached = [], [], 0, 0
        start = time.perf_counter()
        for _ in range(bench.turns):
            for c in range(bench.num_prompts):
                histories[c] = histories[c] + random_ids(bench.max_input_len, vocab, rng)
                sent = time.monotonic()
                out = llm.generate([{"prompt_token_ids": histories[c]}], params, use_tqdm=False)[0]
                ttfts.append(out.metrics["first_token_time"] - sent)
                outputs.append(out.outputs[0].token_ids)
                prompt_tokens += len(out.prompt_token_ids)
                cached += out.num_cached_tokens
                histories[c] = histories[c] + list(out.outputs[0].token_ids)
        seconds = time.perf_counter() - start
        stats = llm.llm_engine.scheduler_stats()
        num_blocks = stats.num_blocks
    finally:
        llm.shutdown()
    return {
        "offload_gib": offload_gib or 0,
        "seconds": seconds,
        "mean_ttft_ms": 1e3 * statistics.mean(ttfts),
        "p50_ttft_ms": 1e3 * statistics.median(ttfts),
        "p99_ttft_ms": 1e3 * float(np.percentile(ttfts, 99)),
        "hit_rate": cached / prompt_tokens,
        "device_hit_tokens": stats.prefix_cache_hits,
        "host_hit_tokens": stats.external_prefix_cache_hits,
        "computed_prompt_tokens": prompt_tokens - cached,
        "prompt_tokens": prompt_tokens,
        "num_kv_blocks": num_blocks,
        "outputs": outputs,
    }


def format_multi_turn(cfg: VllmConfig, m: dict[str, Any]) -> str:
    b = cfg.bench
    lines = [
        f"== minivllm bench multi_turn: {cfg.model.path} on {cfg.device_type}; {b.num_prompts} chats x {b.turns} "
        f"turns, {b.prefix_len}-token system prompts, {b.max_input_len}-token messages, {b.max_output_len} "
        f"tokens per turn; device cache {m['runs'][0]['num_kv_blocks']} blocks of {cfg.cache.block_size}",
        f"{'offload GiB':>12}{'seconds':>9}{'mean TTFT ms':>14}{'p50 TTFT':>10}{'p99 TTFT':>10}{'hit rate':>10}"
        f"{'device hits':>13}{'host hits':>11}{'computed':>10}",
    ]
    for r in m["runs"]:
        lines.append(
            f"{r['offload_gib']:>12g}{r['seconds']:9.2f}{r['mean_ttft_ms']:14.1f}{r['p50_ttft_ms']:10.1f}"
            f"{r['p99_ttft_ms']:10.1f}{100 * r['hit_rate']:9.1f}%{r['device_hit_tokens']:13d}"
            f"{r['host_hit_tokens']:11d}{r['computed_prompt_tokens']:10d}"
        )
    if "mean_ttft_off_over_on" in m:
        lines.append(f"mean TTFT off/on: {m['mean_ttft_off_over_on']:.2f}x")
    lines.append(f"identical greedy outputs in every run: {m['identical_outputs']}")
    return "\n".join(lines)

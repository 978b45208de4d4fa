"""task=bench with KV beyond the device: multi-turn chat whose prefixes exceed the device
cache, with and without the host-memory tier (``bench=offload``); disaggregated prefill
against one engine (``bench=disagg``).

``bench.workload=multi_turn``: ``bench.num_prompts`` conversations, each with a system
prompt of its own (``bench.prefix_len`` random tokens), take turns round-robin for
``bench.turns`` rounds; every turn sends the whole conversation so far plus a new
``bench.max_input_len``-token message and generates ``bench.max_output_len`` tokens
(greedy, EOS ignored). One turn runs at a time, so its TTFT is its prefill, no queueing.
With ``cache.kv_offloading_size`` set the engine runs four times in this process,
alternating off, on, on, off (same device cache, same turns), and the report gives each
run's hit rate (prompt tokens not computed / prompt tokens), device and host hits, TTFT
and whether every run generated the same tokens; without it, once, off.

``bench.workload=disagg``: steady decodes and long prompts arriving among them
(``disagg_requests``), replayed four times alternating: one engine (``replay``), a prefill
engine in another process with a decode engine here pulling each request's KV point to
point (``P2pConnector``), twice, and one engine again. TTFT and ITL percentiles of each
kind of request; the prefill + decode runs count the prefill's time and the transfer in TTFT.
"""

from __future__ import annotations

import contextlib
import copy
import json
import multiprocessing as mp
import os
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from minivllm.bench.run import RequestTiming, latency_summary, replay
from minivllm.bench.workloads import BenchRequest, random_ids
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.distributed.utils import get_open_port
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams

KV_WORKLOADS = ("multi_turn", "disagg")
"""The workloads task=bench runs here rather than in ``run.py`` (their requests depend on
answers, or they need two engines)."""


def run_kv_bench(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    """task=bench for a workload of ``KV_WORKLOADS``: run it, print the report, write out_dir/metrics.json."""
    if cfg.bench.workload == "multi_turn":
        metrics = {"status": "ok", "workload": "multi_turn", **bench_multi_turn(cfg)}
        report = format_multi_turn(cfg, metrics)
    else:
        metrics = {"status": "ok", "workload": "disagg", **bench_disagg(cfg)}
        report = format_disagg(cfg, metrics)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(report)
    print(f"metrics in {out_dir / 'metrics.json'}")
    return metrics


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


# ---- disaggregated prefill against one engine (bench=disagg) ---------------------------------


def disagg_requests(cfg: VllmConfig) -> tuple[list[BenchRequest], list[float]]:
    """The mix and its arrival times: ``bench.num_prompts`` steady decodes (short prompts of
    ``min_input_len``-``max_input_len`` tokens, ``max_output_len`` tokens each) at the start, then
    ``bench.num_long_prompts`` long prompts (``long_prompt_len`` tokens, ``min_output_len`` each)
    arriving evenly at ``bench.request_rate`` per second."""
    b, rng = cfg.bench, np.random.default_rng(cfg.bench.seed)
    vocab = cfg.hf_text_config.vocab_size
    steady = [
        BenchRequest(random_ids(int(rng.integers(b.min_input_len, b.max_input_len + 1)), vocab, rng), b.max_output_len)
        for _ in range(b.num_prompts)
    ]
    long = [
        BenchRequest(random_ids(b.long_prompt_len, vocab, rng), b.min_output_len) for _ in range(b.num_long_prompts)
    ]
    gap = 0.0 if b.request_rate == float("inf") else 1.0 / b.request_rate
    return steady + long, [0.0] * len(steady) + [(i + 1) * gap for i in range(len(long))]


def bench_disagg(cfg: VllmConfig) -> dict[str, Any]:
    """One engine, then a prefill engine (another process) + a decode engine (this one), then
    one engine again: TTFT and ITL percentiles of the steady decodes and of the long prompts."""
    requests, arrivals = disagg_requests(cfg)
    steady = cfg.bench.num_prompts
    runs = []
    for kind in ("one engine", "prefill + decode", "prefill + decode", "one engine"):
        if kind == "one engine":
            llm = LLM.from_config(cfg)
            try:
                llm.generate([{"prompt_token_ids": requests[0].prompt_token_ids}], _greedy(4), use_tqdm=False)
                timings = replay(llm, requests, arrivals, 0.0)
            finally:
                llm.shutdown()
            pulled = 0
        else:
            timings, pulled = _replay_disagg(cfg, requests, arrivals)
        runs.append(
            {
                "setup": kind,
                "pulled_prompt_tokens": pulled,
                "all": latency_summary(timings),
                "steady_decodes": latency_summary(timings[:steady]),
                "long_prompts": latency_summary(timings[steady:]),
            }
        )
    return {"runs": runs, "load_average_1m": os.getloadavg()[0]}


def _greedy(max_tokens: int, extra: dict | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA, extra_args=extra
    )


def _prefill_server(cfg: VllmConfig, conn: Any) -> None:
    """The prefill engine's process: prefill each batch of (index, prompt) it is sent, send back
    (index, kv_transfer_params); stop at None."""
    llm = LLM.from_config(cfg)
    try:
        llm.generate([{"prompt_token_ids": [5] * 16}], _greedy(1), use_tqdm=False)
        conn.send("ready")
        while (batch := conn.recv()) is not None:
            outs = llm.generate([{"prompt_token_ids": ids} for _, ids in batch], _greedy(1), use_tqdm=False)
            conn.send([(i, out.kv_transfer_params) for (i, _), out in zip(batch, outs)])
    finally:
        llm.shutdown()


def _replay_disagg(cfg: VllmConfig, requests: list[BenchRequest], arrivals: list[float]) -> tuple[list[Any], int]:
    """``replay`` with every request prefilled first by a producer engine in another process and
    decoded here by a consumer engine that pulls its KV (P2pConnector over gloo or NCCL); the
    timings and the prompt tokens pulled."""
    port = get_open_port()
    prefill_cfg, decode_cfg = copy.deepcopy(cfg), copy.deepcopy(cfg)
    prefill_cfg.kv_transfer = KVTransferConfig("P2pConnector", "kv_producer", kv_port=port)
    decode_cfg.kv_transfer = KVTransferConfig("P2pConnector", "kv_consumer")
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_prefill_server, args=(prefill_cfg, there), daemon=True)
    proc.start()
    ready: queue.Queue = queue.Queue()
    pending: queue.Queue = queue.Queue()

    def relay() -> None:  # sends what arrived as one batch, waits for its params
        while (first := pending.get()) is not None:
            batch = [first]
            while not pending.empty():
                item = pending.get()
                if item is None:
                    pending.put(None)
                    break
                batch.append(item)
            here.send(batch)
            for item in here.recv():
                ready.put(item)

    llm = LLM.from_config(decode_cfg)
    thread = threading.Thread(target=relay, daemon=True)
    try:
        llm.generate([{"prompt_token_ids": requests[0].prompt_token_ids}], _greedy(4), use_tqdm=False)
        if here.recv() != "ready":
            raise RuntimeError("bench=disagg: the prefill engine did not start")
        thread.start()
        engine, timings = llm.llm_engine, {}
        order = sorted(range(len(requests)), key=lambda i: arrivals[i])
        sent, added, start = 0, 0, time.perf_counter()
        while added < len(requests) or engine.has_unfinished_requests():
            now = time.perf_counter() - start
            while sent < len(order) and arrivals[order[sent]] <= now:
                i = order[sent]
                timings[i] = RequestTiming(arrivals[i])
                pending.put((i, requests[i].prompt_token_ids))
                sent += 1
            while not ready.empty():
                i, params = ready.get()
                prompt = {"prompt_token_ids": requests[i].prompt_token_ids}
                engine.add_request(
                    f"disagg-{i}", prompt, _greedy(requests[i].max_tokens, {"kv_transfer_params": params})
                )
                added += 1
            if not engine.has_unfinished_requests():
                time.sleep(0.001)  # waiting for an arrival or a prefill
                continue
            outputs = engine.step()
            now = time.perf_counter() - start
            for out in outputs:
                produced = len(out.outputs[0].token_ids)
                if produced:
                    timings[int(out.request_id.removeprefix("disagg-"))].deliver(now, produced)
        pulled = engine.scheduler_stats().external_prefix_cache_hits
    finally:
        pending.put(None)
        llm.shutdown()
        if thread.is_alive():
            thread.join(30)
        with contextlib.suppress(OSError):
            here.send(None)
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    return [timings[i] for i in range(len(requests))], pulled


def format_disagg(cfg: VllmConfig, m: dict[str, Any]) -> str:
    b = cfg.bench
    lines = [
        f"== minivllm bench disagg: {cfg.model.path} on {cfg.device_type}; {b.num_prompts} steady decodes "
        f"({b.min_input_len}-{b.max_input_len} prompt tokens, {b.max_output_len} out) + {b.num_long_prompts} "
        f"long prompts ({b.long_prompt_len} tokens, {b.min_output_len} out) at {b.request_rate}/s; "
        f"load average {m['load_average_1m']:.2f}",
        f"{'setup':<18}{'requests':<15}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'out tok/s':>11}",
    ]
    for r in m["runs"]:
        if r["pulled_prompt_tokens"]:
            lines.append(f"{r['setup']}: {r['pulled_prompt_tokens']} prompt tokens pulled by the decode engine")
        for part in ("steady_decodes", "long_prompts", "all"):
            s = r[part]
            lines.append(
                f"{r['setup']:<18}{part:<15}{s['ttft_p50_ms']:10.1f}{s['ttft_p99_ms']:10.1f}{s['itl_p50_ms']:9.1f}"
                f"{s['itl_p99_ms']:9.1f}{s['output_tokens_per_s']:11.1f}"
            )
    return "\n".join(lines)

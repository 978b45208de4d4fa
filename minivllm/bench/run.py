"""task=bench: offline throughput of a workload, optionally against transformers
(``bench=serving``: requests arriving over time, with latency percentiles: replay.py).

    python -m minivllm task=bench model=opt-125m load.format=dummy bench.baseline=hf

Writes ``metrics.json`` into the run folder: requests/s, input and output
tokens/s, total time, KV blocks, preemptions, peak memory, the engine's
overhead per step, single-request decode speed, the bandwidth roofline and,
with ``bench.baseline=hf``, transformers' numbers and the ratio.
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from minivllm.bench import hf_baseline
from minivllm.bench.images import image_requests, placeholder_token_ids
from minivllm.bench.memory import PeakMemory
from minivllm.bench.replay import bench_serving
from minivllm.bench.report import format_report
from minivllm.bench.roofline import roofline
from minivllm.bench.step_timer import StepTimer
from minivllm.bench.warmup import model_runner, warm_up
from minivllm.bench.workloads import BenchRequest, build_workload, random_ids
from minivllm.config.vllm_config import VllmConfig
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams


def run_bench(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    """Run the workload (and the baseline), print the report, write out_dir/metrics.json."""
    requests, single = _workload(cfg)  # a bad workload fails before any work
    with tempfile.TemporaryDirectory(prefix="minivllm-bench-") as tmp:
        if cfg.bench.baseline == "hf":
            cfg = hf_baseline.shared_checkpoint(cfg, Path(tmp))
        metrics = _describe(cfg, requests)
        if cfg.bench.mode == "serving":
            metrics.update(bench_serving(cfg, requests))
        else:
            metrics.update(bench_minivllm(cfg, requests, single))
        if cfg.bench.baseline == "hf":
            bench_transformers(cfg, requests, single, metrics)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(format_report(metrics))
    print(f"metrics in {out_dir / 'metrics.json'}")
    return metrics


def _workload(cfg: VllmConfig) -> tuple[list[BenchRequest], BenchRequest | None]:
    encode = None
    if cfg.bench.workload == "jsonl":
        from minivllm.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(cfg)
        encode = lambda text: tokenizer.encode(text, add_special_tokens=True)  # noqa: E731
    vocab_size, exclude = cfg.hf_text_config.vocab_size, placeholder_token_ids(cfg)
    if cfg.bench.workload == "images":
        requests = image_requests(cfg)
    else:
        requests = build_workload(cfg.bench, vocab_size, cfg.max_model_len, encode, exclude)
    single = None
    if cfg.bench.single_request and cfg.bench.mode == "throughput":
        rng = np.random.default_rng(cfg.bench.seed + 1)
        ids = random_ids(cfg.bench.single_input_len, vocab_size, rng, exclude)
        single = BenchRequest(ids, cfg.bench.single_output_len)
        if single.num_tokens > cfg.max_model_len:
            raise ValueError(
                f"bench.single_input_len + bench.single_output_len = {single.num_tokens}: more than "
                f"max_model_len={cfg.max_model_len}"
            )
    return requests, single


def _describe(cfg: VllmConfig, requests: list[BenchRequest]) -> dict[str, Any]:
    return {
        "status": "ok",
        "model": cfg.model.path,
        "architecture": cfg.architecture,
        "device": cfg.device_type,
        "dtype": str(cfg.dtype).removeprefix("torch."),
        "attention_backend": cfg.attention.backend["_target_"].rsplit(".", 1)[-1],
        "workload": cfg.bench.workload,
        "mode": cfg.bench.mode,
        "num_requests": len(requests),
        "input_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "requested_output_tokens": sum(r.max_tokens for r in requests),
        "images": sum(len(r.images) for r in requests),
        "block_size": cfg.cache.block_size,
        "gpu_memory_utilization": cfg.cache.gpu_memory_utilization,
    }


def _params(request: BenchRequest, temperature: float) -> SamplingParams:
    return SamplingParams(
        temperature=temperature,
        max_tokens=request.max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _drive(
    llm: LLM, requests: list[BenchRequest], cfg: VllmConfig, timer: StepTimer, desc: str | None
) -> tuple[float, int, float, int]:
    """Queue every request, step until all finish; returns (seconds, output tokens, CPU seconds,
    prompt tokens: image placeholders expanded)."""
    engine = llm.llm_engine
    show = desc is not None and cfg.bench.progress
    bar = tqdm(total=len(requests), desc=desc, unit="req", disable=not show or None)
    produced = prompt_tokens = 0
    start, start_cpu = time.perf_counter(), time.process_time()
    with bar:
        for r in requests:
            engine.add_request(None, r.prompt, _params(r, cfg.bench.temperature))
        while engine.has_unfinished_requests():
            for out in timer.run_step(engine.step):
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
                    prompt_tokens += len(out.prompt_token_ids)
                    bar.update(1)
    return time.perf_counter() - start, produced, time.process_time() - start_cpu, prompt_tokens


def bench_minivllm(cfg: VllmConfig, requests: list[BenchRequest], single: BenchRequest | None) -> dict[str, Any]:
    if cfg.parallel.dp > 1:
        raise ValueError(
            f"parallel.dp={cfg.parallel.dp}: task=bench times one engine's steps and does not support data "
            "parallelism; use parallel.dp=1 (benchmarks/serving.py measures a served dp engine)"
        )
    peak = PeakMemory(torch.device(cfg.device_type))
    llm = LLM.from_config(cfg)
    try:
        runner = model_runner(llm)
        device = runner.device if runner is not None else torch.device(cfg.device_type)
        timer = StepTimer(llm.llm_engine.core.executor, runner, device).attach()
        out: dict[str, Any] = {}
        if cfg.bench.warmup:
            out["warmup_max_step_tokens"] = warm_up(llm, requests[0], cfg, timer)
        if single is not None:
            timer.reset()
            _drive(llm, [single], cfg, timer, None)
            out["single_request"] = _single_summary(single, timer)
        timer.reset()
        before = llm.llm_engine.scheduler_stats().num_preemptions
        mm = getattr(runner, "mm", None)
        encoded = (mm.num_encoded, mm.num_encoder_calls) if mm is not None else None
        seconds, produced, cpu_s, prompt_tokens = _drive(llm, requests, cfg, timer, "minivllm")
        stats = llm.llm_engine.scheduler_stats()
        out.update(_throughput(requests, seconds, produced, prompt_tokens), cpu_time_s=cpu_s)
        if cfg.bench.workload == "images":
            out.update(_image_rates(requests, seconds, runner, encoded))
        out.update(num_kv_blocks=stats.num_blocks, num_preemptions=stats.num_preemptions - before)
        out["peak_memory_gib"] = peak.read_gib()
        out["engine"] = timer.summary()
        if timer.sees_model:
            out["roofline"] = roofline(timer.steps, runner, device, seconds)
        timer.detach()
    finally:
        llm.shutdown()
    return out


def _single_summary(single: BenchRequest, timer: StepTimer) -> dict[str, Any]:
    """Median decode step of one request alone (robust to one-off stalls on a shared machine)."""
    decode = [s for s in timer.steps if s.decode_only]
    step_s = statistics.median(s.wall_s for s in decode) if decode else None
    out = {
        "input_len": len(single.prompt_token_ids),
        "output_len": single.max_tokens,
        "decode_tokens_per_s": 1.0 / step_s if step_s else None,
        "decode_step_ms": 1e3 * step_s if step_s else None,
        "model_ms_per_step": None,
        "overhead_ms_per_step": None,
    }
    if decode and timer.sees_model:
        out["model_ms_per_step"] = 1e3 * statistics.median(s.model_s for s in decode)
        out["overhead_ms_per_step"] = 1e3 * statistics.median(s.wall_s - s.model_s for s in decode)
    return out


def _throughput(requests: list[BenchRequest], seconds: float, produced: int, input_tokens: int) -> dict[str, Any]:
    """Rates over the run; ``input_tokens`` counts the prompts as the engine ran them (images expanded)."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": produced,
        "total_time_s": seconds,
        "requests_per_s": len(requests) / seconds,
        "input_tokens_per_s": input_tokens / seconds,
        "output_tokens_per_s": produced / seconds,
        "total_tokens_per_s": (input_tokens + produced) / seconds,
    }


def _image_rates(requests: list[BenchRequest], seconds: float, runner: Any, before: tuple[int, int] | None) -> dict:
    """Images per second; ``images_encoded``: images the vision encoder ran on in the run, equal to
    the images sent since every request's images differ; ``encoder_calls``: its calls (a step's
    images share one where the model batches them). Both None with workers in other processes."""
    images = sum(len(r.images) for r in requests)
    if before is None:
        return {"images_per_s": images / seconds, "images_encoded": None, "encoder_calls": None}
    encoded, calls = runner.mm.num_encoded - before[0], runner.mm.num_encoder_calls - before[1]
    return {"images_per_s": images / seconds, "images_encoded": encoded, "encoder_calls": calls}


def bench_transformers(
    cfg: VllmConfig, requests: list[BenchRequest], single: BenchRequest | None, metrics: dict[str, Any]
) -> None:
    device = torch.device(cfg.device_type)
    gc.collect()  # the engine's KV cache may still be held by reference cycles: free it before the hf model loads
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model = hf_baseline.load_hf_model(cfg, device)
    try:
        if cfg.bench.warmup:
            hf_baseline.generate_batch(model, [requests[0].prompt_token_ids[:16]], 4, cfg.bench.temperature)
        if single is not None:
            hf_single = hf_baseline.hf_single_request(model, single, cfg.bench.temperature)
            ours = metrics["single_request"]
            ours["hf_decode_tokens_per_s"] = hf_single["decode_tokens_per_s"]
            ours["hf_decode_step_ms"] = hf_single["decode_step_ms"]
            ours["decode_speedup"] = _ratio(ours["decode_tokens_per_s"], hf_single["decode_tokens_per_s"])
        base = hf_baseline.run_hf(model, requests, cfg.bench.hf_batch_size, cfg.bench.temperature, cfg.bench.progress)
    finally:
        del model
    metrics["baseline"] = base
    metrics["speedup_output_tokens_per_s"] = _ratio(metrics["output_tokens_per_s"], base["output_tokens_per_s"])
    metrics["speedup_cpu_time"] = _ratio(base["cpu_time_s"], metrics["cpu_time_s"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None

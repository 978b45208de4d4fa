"""task=bench: the timed run of a workload and its report; offline throughput, or
requests arriving over time (``bench=serving``); optionally against transformers.

    python -m minivllm task=bench model=opt-125m load.format=dummy bench.baseline=hf
    python -m minivllm task=bench bench=serving bench.request_rate=8

Writes ``metrics.json`` into the run folder and prints the same numbers as a report:
requests/s, input and output tokens/s, total time, KV blocks, preemptions, peak memory,
the engine's overhead per step, single-request decode speed, the bandwidth roofline
and, with ``bench.baseline=hf``, transformers' numbers and the ratio (``bench.baseline=vllm``:
vLLM's, run from the venv of ``bench.peer_python`` by ``vllm_peer.py``; ``bench.baseline=llamacpp``:
llama.cpp's batched API on an f32 GGUF of the same weights, by ``llamacpp_peer.py``; both with how
many requests generated the same tokens on both engines).

Peak memory is read on the device the run used. CUDA: the allocator's high-water
mark. CPU: the process's resident high-water mark (``VmHWM``), reset at the start
where Linux allows it (``/proc/self/clear_refs``), so each job of a multirun reports
its own peak rather than the process's.

**bench.mode=serving** replays a workload whose requests arrive over time. The engine
runs in this process (``LLM.from_config``) and is stepped here; a request joins the
engine once the clock passes its arrival time (Poisson or evenly spaced at
``bench.request_rate``; ``inf``: all at the start). Every step's new tokens are
timestamped, which gives per request, as vLLM's serving benchmark reports them:

- TTFT  arrival -> first generated token (queueing and prefill included)
- ITL   the gaps between consecutive deliveries of new tokens
- E2E   arrival -> last token

and for the run: output tokens/s from the first arrival to the last token.
No HTTP and no detokenization cost is in these numbers: they measure the engine.
"""

from __future__ import annotations

import gc
import json
import math
import resource
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from minivllm.bench import hf_baseline, llamacpp_peer, vllm_peer
from minivllm.bench.timing import StepTimer, roofline
from minivllm.bench.workloads import (
    BenchRequest,
    build_workload,
    image_requests,
    placeholder_token_ids,
    random_ids,
    random_image,
    rehearsal_requests,
)
from minivllm.config.task import BENCH_PEERS, BenchConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.distributed.utils import cpu_threads
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams

GiB = float(1 << 30)
PERCENTILES = (50, 99)


def run_bench(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    """Run the workload (and the baseline), print the report, write out_dir/metrics.json."""
    requests, single = _workload(cfg)  # a bad workload fails before any work
    with tempfile.TemporaryDirectory(prefix="minivllm-bench-") as tmp:
        if cfg.bench.baseline != "none":
            cfg = hf_baseline.shared_checkpoint(cfg, Path(tmp))
        metrics = _describe(cfg, requests)
        token_ids: list[list[int]] | None = [] if cfg.bench.baseline in BENCH_PEERS else None
        if cfg.bench.mode == "serving":
            metrics.update(bench_serving(cfg, requests))
        else:
            metrics.update(bench_minivllm(cfg, requests, single, token_ids))
        if cfg.bench.baseline == "hf":
            bench_transformers(cfg, requests, single, metrics)
        if cfg.bench.baseline in BENCH_PEERS:
            bench_peer(cfg, requests, single, metrics, token_ids, Path(tmp))
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(format_report(metrics))
    print(f"metrics in {out_dir / 'metrics.json'}")
    return metrics


def _workload(cfg: VllmConfig) -> tuple[list[BenchRequest], BenchRequest | None]:
    encode = None
    if cfg.bench.workload == "jsonl":  # the tokenizer loads only for a text prompt (token-id lines need none)
        from minivllm.tokenizer import get_tokenizer

        loaded: list[Any] = []

        def encode(text: str) -> list[int]:
            if not loaded:
                loaded.append(get_tokenizer(cfg))
            return loaded[0].encode(text, add_special_tokens=True)

    vocab_size, exclude = cfg.hf_text_config.vocab_size, placeholder_token_ids(cfg)
    if cfg.bench.workload == "images":
        requests = image_requests(cfg)
    else:
        requests = build_workload(cfg.bench, vocab_size, cfg.max_model_len, encode, exclude)
    if cfg.bench.baseline == "hf" and any(r.temperature is not None or not r.ignore_eos for r in requests):
        raise ValueError(
            "bench.baseline=hf: transformers runs every request at bench.temperature with EOS ignored; "
            "the prompts_file's lines set their own temperature or ignore_eos=false (drop those keys)"
        )
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


# ---- the engine under test: its peak memory, its warm-up --------------------------------------


class PeakMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            _reset_cpu_peak()

    def read_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GiB
        return _cpu_peak_bytes() / GiB


def _reset_cpu_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: the lifetime peak is reported instead


def _cpu_peak_bytes() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


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


# ---- throughput mode -----------------------------------------------------------------------


def _params(
    request: BenchRequest,
    temperature: float,
    kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
    detokenize: bool = True,
) -> SamplingParams:
    """The request's own temperature and ignore_eos (a jsonl line's), else bench.temperature."""
    return SamplingParams(
        temperature=temperature if request.temperature is None else request.temperature,
        max_tokens=request.max_tokens,
        ignore_eos=request.ignore_eos,
        output_kind=kind,
        detokenize=detokenize,
    )


def _drive(
    llm: LLM,
    requests: list[BenchRequest],
    cfg: VllmConfig,
    timer: StepTimer,
    desc: str | None,
    token_ids: list[list[int]] | None = None,
) -> tuple[float, int, float, int]:
    """Queue every request, step until all finish; returns (seconds, output tokens, CPU seconds,
    prompt tokens: image placeholders expanded). ``token_ids``: filled with each request's
    generated tokens, in the order of ``requests``."""
    engine = llm.llm_engine
    generated: dict[str, list[int]] = {}
    show = desc is not None and cfg.bench.progress
    bar = tqdm(total=len(requests), desc=desc, unit="req", disable=not show or None)
    produced = prompt_tokens = 0
    start, start_cpu = time.perf_counter(), time.process_time()
    with bar:
        detokenize = cfg.bench.baseline not in BENCH_PEERS  # the peers run without a tokenizer: the same work
        ids = [
            engine.add_request(None, r.prompt, _params(r, cfg.bench.temperature, detokenize=detokenize))
            for r in requests
        ]
        while engine.has_unfinished_requests():
            for out in timer.run_step(engine.step):
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
                    prompt_tokens += len(out.prompt_token_ids)
                    generated[out.request_id] = list(out.outputs[0].token_ids)
                    bar.update(1)
    if token_ids is not None:
        token_ids[:] = [generated[i] for i in ids]
    return time.perf_counter() - start, produced, time.process_time() - start_cpu, prompt_tokens


def bench_minivllm(
    cfg: VllmConfig,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    token_ids: list[list[int]] | None = None,
) -> dict[str, Any]:
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
            start, start_cpu = time.perf_counter(), time.process_time()
            out["warmup_max_step_tokens"] = warm_up(llm, requests[0], cfg, timer)
            rehearsal = rehearsal_requests(cfg, requests)
            if rehearsal is not None:  # the CPU: the timed run's shapes, untimed
                _drive(llm, rehearsal, cfg, timer, None)
            out["warmup"] = {
                "time_s": time.perf_counter() - start,
                "cpu_time_s": time.process_time() - start_cpu,
                "rehearsed_requests": len(rehearsal or ()),
            }
        if single is not None:
            timer.reset()
            _drive(llm, [single], cfg, timer, None)
            out["single_request"] = _single_summary(single, timer)
        timer.reset()
        before = llm.llm_engine.scheduler_stats().num_preemptions
        mm = getattr(runner, "mm", None)
        encoded = (mm.num_encoded, mm.num_encoder_calls) if mm is not None else None
        seconds, produced, cpu_s, prompt_tokens = _drive(llm, requests, cfg, timer, "minivllm", token_ids)
        stats = llm.llm_engine.scheduler_stats()
        out.update(_throughput(requests, seconds, produced, prompt_tokens), cpu_time_s=cpu_s)
        if cfg.bench.workload == "images":
            out.update(_image_rates(requests, seconds, runner, encoded))
        out.update(num_kv_blocks=stats.num_blocks, num_preemptions=stats.num_preemptions - before)
        out["peak_memory_gib"] = peak.read_gib()
        out["engine"] = timer.summary()
        if timer.sees_model:
            out["roofline"] = roofline(timer.steps, runner, device, seconds, produced)
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


# ---- serving mode: arrivals over time ---------------------------------------------------------


@dataclass
class RequestTiming:
    """One request's clock, in seconds since the replay started."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)

    def deliver(self, now: float, num_tokens: int) -> None:
        if self.first_token is None:
            self.first_token = now
        else:
            self.gaps.append(now - self.last_token)
        self.last_token = now
        self.output_tokens += num_tokens


def arrival_times(cfg: BenchConfig, n: int) -> list[float]:
    """Seconds after the start at which each of ``n`` requests arrives."""
    if math.isinf(cfg.request_rate):
        return [0.0] * n
    if cfg.arrival == "uniform":
        return [i / cfg.request_rate for i in range(n)]
    gaps = np.random.default_rng(cfg.seed + 3).exponential(1.0 / cfg.request_rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])]).tolist()


def replay(llm: LLM, requests: list[BenchRequest], arrivals: list[float], temperature: float) -> list[RequestTiming]:
    """Add each request at its arrival time, step until all finish; the clock of each."""
    engine = llm.llm_engine
    order = deque(sorted(range(len(requests)), key=lambda i: arrivals[i]))
    timings: dict[str, RequestTiming] = {}
    start = time.perf_counter()
    while order or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while order and arrivals[order[0]] <= now:
            i = order.popleft()
            params = _params(requests[i], temperature, RequestOutputKind.DELTA)
            rid = engine.add_request(f"replay-{i}", {"prompt_token_ids": requests[i].prompt_token_ids}, params)
            timings[rid] = RequestTiming(arrivals[i])
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[order[0]] - now))  # idle until the next arrival
            continue
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            produced = len(out.outputs[0].token_ids)
            if produced:
                timings[out.request_id].deliver(now, produced)
    return list(timings.values())


def latency_summary(timings: list[RequestTiming]) -> dict[str, Any]:
    """Throughput and the p50/p99/mean of TTFT, ITL and E2E, in milliseconds."""
    done = [t for t in timings if t.first_token is not None]
    duration = max(t.last_token for t in done) - min(t.arrival for t in timings)
    produced = sum(t.output_tokens for t in done)
    series = {
        "ttft": [t.first_token - t.arrival for t in done],
        "itl": [g for t in done for g in t.gaps],
        "e2e": [t.last_token - t.arrival for t in done],
    }
    out: dict[str, Any] = {
        "output_tokens": produced,
        "total_time_s": duration,
        "requests_per_s": len(done) / duration,
        "output_tokens_per_s": produced / duration,
    }
    for name, values in series.items():
        ms = 1e3 * np.asarray(values or [0.0])
        out[f"{name}_mean_ms"] = float(ms.mean())
        for p in PERCENTILES:
            out[f"{name}_p{p}_ms"] = float(np.percentile(ms, p))
    return out


def bench_serving(cfg: VllmConfig, requests: list[BenchRequest]) -> dict[str, Any]:
    """Start the engine with ``cfg``, warm it up, replay the workload at its arrival times."""
    if cfg.parallel.dp > 1:
        raise ValueError(f"parallel.dp={cfg.parallel.dp}: bench.mode=serving steps one engine; use parallel.dp=1")
    peak = PeakMemory(torch.device(cfg.device_type))
    llm = LLM.from_config(cfg)
    try:
        runner = model_runner(llm)
        device = runner.device if runner is not None else torch.device(cfg.device_type)
        timer = StepTimer(llm.llm_engine.core.executor, runner, device).attach()
        if cfg.bench.warmup:
            warm_up(llm, requests[0], cfg, timer)
        timer.detach()
        before = llm.llm_engine.scheduler_stats().num_preemptions
        timings = replay(llm, requests, arrival_times(cfg.bench, len(requests)), cfg.bench.temperature)
        stats = llm.llm_engine.scheduler_stats()
        out = latency_summary(timings)
        out["input_tokens_per_s"] = sum(len(r.prompt_token_ids) for r in requests) / out["total_time_s"]
        out.update(num_kv_blocks=stats.num_blocks, num_preemptions=stats.num_preemptions - before)
        out["request_rate"] = cfg.bench.request_rate
        out["peak_memory_gib"] = peak.read_gib()
    finally:
        llm.shutdown()
    return out


# ---- the transformers baseline --------------------------------------------------------------


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


# ---- the peers in their own venvs (vllm_peer.py, llamacpp_peer.py) ----------------------------


def bench_peer(
    cfg: VllmConfig,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    metrics: dict[str, Any],
    token_ids: list[list[int]] | None,
    scratch: Path,
) -> None:
    """Run the workload through ``bench.baseline``'s peer engine; its numbers, the ratios and the
    token agreement into ``metrics`` (``baseline``; ``single_request.<peer>_decode_tokens_per_s``)."""
    gc.collect()  # the engine's KV cache may still be held by reference cycles: free it before the peer starts
    threads = cpu_threads(cfg.device.cpu_threads, None)
    rehearsal = rehearsal_requests(cfg, requests)
    if cfg.bench.baseline == "llamacpp":
        base = llamacpp_peer.run_peer(cfg, requests, single, threads, scratch, rehearsal)
    else:
        per_token = (metrics.get("roofline") or {}).get("kv_bytes_per_token")
        kv_bytes = metrics["num_kv_blocks"] * cfg.cache.block_size * per_token if per_token else 1 << 30
        base = vllm_peer.run_peer(cfg, requests, single, threads, kv_bytes, rehearsal)
    base["tokens"] = vllm_peer.token_agreement(token_ids, base.pop("token_ids"))
    name = base["name"]
    if single is not None and "decode_tokens_per_s" in base:
        ours = metrics["single_request"]
        ours[f"{name}_decode_tokens_per_s"] = base["decode_tokens_per_s"]
        ours[f"decode_speedup_vs_{name}"] = _ratio(ours["decode_tokens_per_s"], base["decode_tokens_per_s"])
    metrics["baseline"] = base
    metrics["speedup_output_tokens_per_s"] = _ratio(metrics["output_tokens_per_s"], base["output_tokens_per_s"])
    metrics["speedup_cpu_time"] = _ratio(base["cpu_time_s"], metrics["cpu_time_s"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# ---- the report (metrics.json holds the same numbers) ----------------------------------------


def _num(value: Any, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def format_report(m: dict[str, Any]) -> str:
    lines = [
        f"== minivllm bench: {m['model']} ({m['architecture']}) on {m['device']}, {m['dtype']}, "
        f"{m['attention_backend']}",
        f"workload {m['workload']}: {m['num_requests']} requests, {m['input_tokens']} prompt tokens, "
        f"{m['requested_output_tokens']} output tokens",
        f"{'':18}{'req/s':>9}{'in tok/s':>11}{'out tok/s':>11}{'time s':>9}{'cpu s':>9}",
        _row("minivllm", m),
    ]
    base = m.get("baseline")
    if base:
        lines.append(_row(f"{base['name']} bs={base['batch_size']}", base))
        lines.append(
            f"speedup: {_num(m.get('speedup_output_tokens_per_s'), '.2f')}x output tok/s, "
            f"{_num(m.get('speedup_cpu_time'), '.2f')}x CPU time"
        )
        agree = base.get("tokens")
        if agree:
            lines.append(
                f"{base['name']} {base.get('version', '')}: start-up {_num(base.get('startup_s'))} s; same tokens in "
                f"{agree['identical_requests']}/{agree['requests']} requests"
                + (
                    f" (first difference at token {agree['first_difference_at']})"
                    if agree["first_difference_at"] is not None
                    else ""
                )
            )
    lines.append(
        f"KV blocks {m['num_kv_blocks']} x {m['block_size']} tokens, preemptions {m['num_preemptions']}, "
        f"peak memory {_num(m['peak_memory_gib'], '.2f')} GiB"
    )
    if "ttft_p99_ms" in m:  # bench.mode=serving
        lines.append(
            f"arrivals at {m['request_rate']} req/s; latency ms p50/p99: TTFT {_num(m['ttft_p50_ms'])}/"
            f"{_num(m['ttft_p99_ms'])}, ITL {_num(m['itl_p50_ms'])}/{_num(m['itl_p99_ms'])}, "
            f"E2E {_num(m['e2e_p50_ms'])}/{_num(m['e2e_p99_ms'])}"
        )
    warm = m.get("warmup")
    if warm:
        rehearsed = warm["rehearsed_requests"]
        line = f"warm-up (untimed): {_num(warm['time_s'], '.2f')} s, {_num(warm['cpu_time_s'], '.2f')} CPU s"
        if rehearsed:
            line += f", the timed requests' shapes rehearsed ({rehearsed} requests)"
        base_warm = (base or {}).get("warmup")
        if base_warm:
            line += (
                f"; {base['name']}: {_num(base_warm['time_s'], '.2f')} s, {_num(base_warm['cpu_time_s'], '.2f')} CPU s"
            )
        lines.append(line)
    eng = m.get("engine") or {}
    if "images_per_s" in m:  # bench.workload=images
        lines.append(
            f"images: {m['images']} sent, {m.get('images_encoded')} encoded in {m.get('encoder_calls')} encoder calls, "
            f"{_num(m['images_per_s'], '.2f')} images/s; "
            f"vision encoder {_num(eng.get('encoder_time_s'), '.2f')} s, "
            f"{_num(_pct(eng.get('encoder_fraction')))}% of step time"
        )
    if eng:
        lines.append(
            f"engine: {eng.get('num_steps')} steps ({eng.get('num_prefill_steps')} with prefill: "
            f"{_num(eng.get('prefill_step_time_s'), '.2f')} s), overhead {_num(eng.get('overhead_per_step_ms'), '.2f')} "
            f"ms/step ({_num(_pct(eng.get('overhead_fraction')))}% of step time)"
        )
    single = m.get("single_request")
    if single:
        line = (
            f"single request ({single['input_len']} in, {single['output_len']} out): decode "
            f"{_num(single['decode_tokens_per_s'])} tok/s, median step {_num(single['decode_step_ms'], '.2f')} ms "
            f"(model {_num(single['model_ms_per_step'], '.2f')}, overhead {_num(single['overhead_ms_per_step'], '.2f')})"
        )
        for peer in BENCH_PEERS:
            if f"{peer}_decode_tokens_per_s" in single:
                line += (
                    f"; {peer} {_num(single[f'{peer}_decode_tokens_per_s'])} tok/s "
                    f"({_num(single[f'decode_speedup_vs_{peer}'], '.2f')}x)"
                )
        if "hf_decode_tokens_per_s" in single:
            line += (
                f"; transformers {_num(single['hf_decode_tokens_per_s'])} tok/s "
                f"({_num(single['decode_speedup'], '.2f')}x)"
            )
        lines.append(line)
    roof = m.get("roofline")
    if roof:
        lines += _floor_lines(roof, m.get("output_tokens"))
    return "\n".join(lines)


def _gemm_rate(tflop_s: float | None) -> str:
    """TFLOP/s, or GFLOP/s below one TFLOP/s (a CPU's rate)."""
    if tflop_s is not None and tflop_s < 1:
        return f"{_num(1e3 * tflop_s, '.0f')} GFLOP/s"
    return f"{_num(tflop_s, '.1f')} TFLOP/s"


def _floor_lines(roof: dict[str, Any], output_tokens: int | None) -> list[str]:
    """The floor with both of its terms, and the measured prefill and decode seconds apart."""
    floor_rate = roof.get("floor_output_tokens_per_s")
    return [
        f"floor ({roof['device']}: copy {_num(roof['copy_bandwidth_gb_s'])} GB/s, GEMM "
        f"{_gemm_rate(roof.get('gemm_tflop_s'))}): {_num(roof['floor_s'], '.2f')} s = decode "
        f"{_num(roof.get('decode_floor_s'), '.2f')} s (bytes) + prefill {_num(roof.get('prefill_floor_s'), '.2f')} s "
        f"(FLOPs {_num(roof.get('prefill_compute_floor_s'), '.2f')} s, bytes {_num(roof.get('prefill_memory_floor_s'), '.2f')} s)"
        + ("" if floor_rate is None else f" -> {_num(floor_rate)} output tok/s at the floor"),
        f"measured {_num(roof['measured_s'], '.2f')} s: prefill steps {_num(roof.get('prefill_measured_s'), '.2f')} s, "
        f"decode steps {_num(roof.get('decode_measured_s'), '.2f')} s -> {_num(_pct(roof['achieved_fraction']))}% "
        f"of the floor (prefill {_num(_pct(roof.get('prefill_achieved_fraction')))}%, decode "
        f"{_num(_pct(roof['decode_achieved_fraction']))}%)",
    ]


def _row(name: str, m: dict[str, Any]) -> str:
    return (
        f"{name:18}{_num(m['requests_per_s'], '.2f'):>9}{_num(m['input_tokens_per_s']):>11}"
        f"{_num(m['output_tokens_per_s']):>11}{_num(m['total_time_s'], '.2f'):>9}{_num(m.get('cpu_time_s'), '.2f'):>9}"
    )


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction

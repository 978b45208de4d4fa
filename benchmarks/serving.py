"""Online serving benchmark: Poisson arrivals against an OpenAI-compatible server.

Sends ``--num-prompts`` streamed /v1/completions requests with random prompt and
output lengths, arriving as a Poisson process at ``--request-rate`` requests/s
(``inf``: all at once), and reports, like vLLM's serving benchmark:

- TTFT  time to first token (request sent -> first text chunk)
- TPOT  time per output token after the first: (E2E - TTFT) / (output tokens - 1)
- ITL   inter-token latency: the gaps between consecutive chunks
- E2E   end-to-end latency
- request, output-token and total-token throughput

Point it at a running server (``--base-url``) or let it start one on a free
port (``--launch MODEL_DIR``, extra ``key=value`` overrides after ``--``); then
it also reports the CPU seconds the API server process and the engine process
spent during the run (Linux /proc)::

    python benchmarks/serving.py --launch /path/to/hf_dir --num-prompts 100 --request-rate 4 \\
        -- model.dtype=float32 cache.num_gpu_blocks_override=512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def random_lengths(rng: random.Random, mean: int, ratio: float) -> int:
    low, high = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return rng.randint(low, high)


async def one_request(http: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(prompt_len=len(prompt))
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", "/v1/completions", json=body) as res:
            if res.status_code != 200:
                result.error = f"HTTP {res.status_code}: {(await res.aread()).decode()[:200]}"
                return result
            async for line in res.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("choices"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_len = chunk["usage"]["completion_tokens"]
        result.e2e = time.perf_counter() - start
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        result.error = repr(err)
    return result


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> dict[str, int]:
    """The server's pid and its engine child's."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    engine = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return {"api_server": pid, **({"engine": engine[0]} if engine else {})}


async def run(args: argparse.Namespace, base_url: str, pids: dict[str, int]) -> dict:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.max_concurrency or 1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        work = []
        for _ in range(args.num_prompts):
            n_in = random_lengths(rng, args.input_len, args.range_ratio)
            prompt = [rng.randrange(args.min_token_id, args.vocab_size) for _ in range(n_in)]
            work.append((prompt, random_lengths(rng, args.output_len, args.range_ratio)))
        await one_request(http, model, work[0][0][:8], 2)  # warm-up
        gate = asyncio.Semaphore(args.max_concurrency or len(work))

        async def limited(prompt: list[int], n_out: int) -> RequestResult:
            async with gate:
                return await one_request(http, model, prompt, n_out)

        pids = {**pids, "client": os.getpid()}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        tasks, start = [], time.perf_counter()
        for prompt, n_out in work:
            tasks.append(asyncio.create_task(limited(prompt, n_out)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        cpu = {f"{name}_cpu_s": cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    return summarize(results, duration, args) | cpu


def summarize(results: list[RequestResult], duration: float, args: argparse.Namespace) -> dict:
    ok = [r for r in results if r.error is None]
    ms = lambda xs: {  # noqa: E731
        "mean": float(np.mean(xs)) * 1e3 if xs else float("nan"),
        "median": float(np.median(xs)) * 1e3 if xs else float("nan"),
        "p99": float(np.percentile(xs, 99)) * 1e3 if xs else float("nan"),
    }
    tpot = [(r.e2e - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "overrides"} | {"overrides": args.overrides},
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "ttft_ms": ms([r.ttft for r in ok]),
        "tpot_ms": ms(tpot),
        "itl_ms": ms([g for r in ok for g in r.itl]),
        "e2e_ms": ms([r.e2e for r in ok]),
    }


def print_report(s: dict) -> None:
    print(f"{'=' * 16} Serving Benchmark Result {'=' * 16}")
    rows = [
        ("Successful requests", s["completed"]),
        ("Failed requests", s["failed"]),
        ("Benchmark duration (s)", f"{s['duration_s']:.2f}"),
        ("Total input tokens", s["total_input_tokens"]),
        ("Total generated tokens", s["total_output_tokens"]),
        ("Request throughput (req/s)", f"{s['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{s['output_token_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{s['total_token_throughput']:.2f}"),
    ]
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize()} {name} (ms)", f"{s[key][stat]:.2f}"))
    for key in ("api_server_cpu_s", "engine_cpu_s", "client_cpu_s"):
        if key in s:
            rows.append((f"CPU s, {key[:-6].replace('_', ' ')} process", f"{s[key]:.2f}"))
    for name, value in rows:
        print(f"{name:<40}{value:>18}")
    for err in s["errors"]:
        print("error:", err)


def launch(model_dir: str, overrides: list[str], log: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m minivllm task=serve`` on a free port; return it and its URL.
    ``log`` (if given) receives every line the server prints."""
    model = f"model.path={model_dir}" if Path(model_dir).is_dir() else f"model={model_dir}"
    cmd = [sys.executable, "-m", "minivllm", "task=serve", model, "serve.port=0", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    keep = log.append if log is not None else (lambda _: None)
    for line in proc.stdout:
        sys.stderr.write(line)
        keep(line)
        m = re.search(r"on (http://[^\s]+)/v1", line)
        if m:  # keep draining its output (access logs) so it never blocks on a full pipe
            threading.Thread(target=lambda: [keep(rest) for rest in proc.stdout], daemon=True).start()
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("the server did not start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="a running server")
    p.add_argument("--launch", metavar="MODEL_DIR", help="start a server for this checkpoint (or preset) instead")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--input-len", type=int, default=64, help="mean prompt tokens")
    p.add_argument("--output-len", type=int, default=32, help="mean output tokens")
    p.add_argument("--range-ratio", type=float, default=0.5, help="lengths uniform in mean*(1 +- ratio)")
    p.add_argument("--vocab-size", type=int, default=500, help="random prompt ids are drawn below this")
    p.add_argument("--min-token-id", type=int, default=10, help="and at or above this (skips special tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", type=Path, help="write the summary here")
    p.add_argument("overrides", nargs="*", help="config overrides for --launch (after --)")
    args = p.parse_args()
    proc, pids = None, {}
    base_url = args.base_url
    if args.launch:
        proc, base_url = launch(args.launch, args.overrides)
        pids = process_tree(proc.pid)
    try:
        summary = asyncio.run(run(args, base_url, pids))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print_report(summary)
    if args.result_json:
        args.result_json.write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()

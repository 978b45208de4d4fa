"""Per-step time with tensor parallelism on this machine, and how much of it is communication.

Runs the same workload three ways: tp=1 in the engine's process (``uni``),
tp=1 in one worker process (``mp``: what the process boundary alone costs),
and tp=2 (``mp``). The workload is one batch of ``--batch`` prompts of
``--prompt-len`` tokens generating ``--max-tokens`` tokens each, repeated
``--repeats`` times; every engine step is timed and classified as a prefill
step (the first, which computes all prompts) or a decode step (one token per
request).

Inside each worker, timers wrap ``torch.distributed.all_reduce`` and
``all_gather`` (the only collectives the model calls) and the worker's
``execute_model``. Reported per step (median over steps):

- ``step``: the engine's call to ``executor.execute_model`` (what a step costs);
- ``worker``: rank 0's own ``execute_model`` (model, sampling, bookkeeping);
- ``comm``: rank 0's time inside collectives, i.e. moving data *and* waiting
  for the slower rank to arrive;
- ``ipc``: ``step - worker``, sending the scheduler output to the ranks and the
  sampled tokens back.

    python benchmarks/tp_step_time.py --model opt-125m --load-format dummy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from minivllm import LLM, SamplingParams

RUNS = "uni:1,mp:1,mp:2"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-125m", help="preset name or checkpoint directory")
    p.add_argument("--load-format", default="dummy", help="auto, safetensors, pt or dummy (random weights)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (defaults to the model's)")
    p.add_argument("--hf-overrides", default="{}", help='JSON merged into config.json, e.g. {"num_hidden_layers": 4}')
    p.add_argument("--batch", type=int, default=8, help="requests decoded together")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runs", default=RUNS, help="comma-separated backend:tp[:threads per rank]")
    return p.parse_args()


# ---- run inside each worker (through collective_rpc) ------------------------------------
def install_timers(worker: Any) -> None:
    """Wrap the collectives and the worker's step with timers, recording one row per step."""
    import torch.distributed as dist

    rows: list[dict[str, float]] = []
    worker.__dict__["bench_rows"] = rows
    comm = {"s": 0.0, "calls": 0}
    for name in ("all_reduce", "all_gather"):
        original = getattr(dist, name)

        def timed(*args, _original=original, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                comm["s"] += time.perf_counter() - start
                comm["calls"] += 1

        setattr(dist, name, timed)
    step = worker.execute_model

    def timed_step(sched):
        comm["s"], comm["calls"] = 0.0, 0
        start = time.perf_counter()
        out = step(sched)
        rows.append(
            {
                "tokens": sched.total_num_scheduled_tokens,
                "worker": time.perf_counter() - start,
                "comm": comm["s"],
                "calls": comm["calls"],
            }
        )
        return out

    worker.execute_model = timed_step


def set_threads(worker: Any, n: int) -> None:
    torch.set_num_threads(n)


def get_threads(worker: Any) -> int:
    return torch.get_num_threads()


def all_reduce_latency(worker: Any, rows: int, hidden: int, iters: int = 200) -> dict[str, float]:
    """Seconds per all-reduce of a (rows, hidden) fp32 tensor, after a barrier: the
    fastest call is the transfer alone, the median adds waiting for the other rank."""
    import torch.distributed as dist

    x = torch.ones(rows, hidden)
    dist.barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - start)
    return {"min": min(times), "median": statistics.median(times)}


def take_rows(worker: Any) -> list[dict[str, float]]:
    rows = list(worker.bench_rows)
    worker.bench_rows.clear()
    return rows


# ---- driver -------------------------------------------------------------------------------
def measure(args: argparse.Namespace, backend: str, tp: int, threads: int | None) -> dict[str, Any]:
    llm = LLM(
        model=args.model,
        load_format=args.load_format,
        tokenizer=args.tokenizer,
        hf_overrides=json.loads(args.hf_overrides),
        dtype="float32",
        tensor_parallel_size=tp,
        distributed_executor_backend=backend,
        enable_prefix_caching=False,
        max_num_seqs=args.batch,
    )
    executor = llm.llm_engine.core.executor
    if threads:
        executor.collective_rpc(set_threads, (threads,))
    threads = executor.collective_rpc(get_threads)[0]
    executor.collective_rpc(install_timers)
    driver_rows: list[float] = []
    execute = executor.execute_model

    def timed_execute(sched):
        start = time.perf_counter()
        out = execute(sched)
        driver_rows.append(time.perf_counter() - start)
        return out

    executor.execute_model = timed_execute
    vocab = llm.cfg.hf_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5] * 16}], params, use_tqdm=False)  # warm-up
    executor.collective_rpc(take_rows)
    driver_rows.clear()
    for rep in range(args.repeats):
        prompts = [
            {"prompt_token_ids": [(7 * rep + 13 * i + j) % vocab for j in range(args.prompt_len)]}
            for i in range(args.batch)
        ]
        llm.generate(prompts, params, use_tqdm=False)
    rank0 = executor.collective_rpc(take_rows)[0]
    extra: dict[str, Any] = {"threads": threads}
    if tp > 1:
        hidden = llm.cfg.hf_config.hidden_size
        for rows in (args.batch, args.batch * args.prompt_len):
            lat = executor.collective_rpc(all_reduce_latency, (rows, hidden))[0]
            extra[f"all_reduce_{rows}x{hidden}_ms"] = {k: v * 1e3 for k, v in lat.items()}
    llm.shutdown()
    return summarize(driver_rows, rank0, args.batch) | extra


def summarize(driver: list[float], rank0: list[dict[str, float]], batch: int) -> dict[str, Any]:
    assert len(driver) == len(rank0), (len(driver), len(rank0))
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for step_s, row in zip(driver, rank0):
        phase = "decode" if row["tokens"] == batch else "prefill" if row["tokens"] > batch else "other"
        for key, value in (
            ("step", step_s),
            ("worker", row["worker"]),
            ("comm", row["comm"]),
            ("ipc", step_s - row["worker"]),
            ("calls", row["calls"]),
        ):
            phases[phase][key].append(value)
    return {
        phase: {key: statistics.median(values) * (1 if key == "calls" else 1e3) for key, values in cols.items()}
        | {"steps": len(cols["step"])}
        for phase, cols in phases.items()
        if phase != "other"
    }


def main() -> None:
    args = parse_args()
    print(
        f"cpus={os.cpu_count()} load average={os.getloadavg()[0]:.1f}; batch={args.batch} "
        f"prompt_len={args.prompt_len} max_tokens={args.max_tokens} repeats={args.repeats}"
    )
    results = []
    for spec in args.runs.split(","):
        backend, tp, *threads = spec.split(":")
        results.append((backend, int(tp), measure(args, backend, int(tp), int(threads[0]) if threads else None)))
        print(spec, json.dumps(results[-1][2]), f"load average={os.getloadavg()[0]:.1f}", flush=True)
    print(
        "\n| backend | tp | threads/rank | phase | steps | step (ms) | rank-0 worker (ms) | collectives/step "
        "| comm (ms) | comm share | ipc (ms) |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for backend, tp, phases in results:
        for phase in ("prefill", "decode"):
            r = phases[phase]
            print(
                f"| {backend} | {tp} | {phases['threads']} | {phase} | {r['steps']} | {r['step']:.1f} | "
                f"{r['worker']:.1f} | {r['calls']:.0f} | {r['comm']:.1f} | {r['comm'] / r['step']:.0%} | "
                f"{r['ipc']:.1f} |"
            )


if __name__ == "__main__":
    main()

"""Does the async front end slow the step loop? The same offline workload through
``LLM.generate`` (the step loop in this process) and through ``AsyncLLM`` (the
step loop in the engine process, outputs streamed back over a pipe).

    python benchmarks/async_vs_offline.py --model /path/to/hf_dir -- model.dtype=float32

Two measurements, each the median of ``--repeats`` alternating runs:

1. CPU seconds of the step loop alone, in this process: ``LLMEngine.step()`` as
   ``LLM`` runs it, against the engine process's loop body (``EngineLoop.step``: delta
   outputs) plus the pickling that ``Connection.send`` does (which packs them as tuples).
   CPU time is immune to other work sharing the machine.
2. Output tokens/s end to end, ``LLM.generate`` against ``AsyncLLM.generate``,
   with the CPU seconds of each side (the engine process's read from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from multiprocessing.reduction import ForkingPickler

from minivllm import LLM, SamplingParams
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.engine_proc import EngineLoop
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import RequestOutputKind


def workload(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)
    return [[rng.randrange(10, args.vocab_size) for _ in range(args.input_len)] for _ in range(args.num_prompts)]


def params(args: argparse.Namespace, kind: RequestOutputKind) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True, output_kind=kind)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loop_cpu(engine: LLMEngine, prompts: list[list[int]], args: argparse.Namespace, ship: bool) -> float:
    """CPU seconds to run the workload through the step loop, with or without shipping outputs."""
    kind = RequestOutputKind.DELTA if ship else RequestOutputKind.CUMULATIVE
    for prompt in prompts:
        engine.add_request(None, {"prompt_token_ids": prompt}, params(args, kind))
    loop = EngineLoop(engine)
    cpu = time.process_time()
    while engine.has_unfinished_requests():
        if ship:
            ForkingPickler.dumps(loop.step())
        else:
            engine.step()
    return time.process_time() - cpu


def run_offline(llm: LLM, prompts: list[list[int]], args: argparse.Namespace) -> tuple[float, float]:
    """(tokens/s, step-loop CPU s); CUMULATIVE outputs every step, LLM's default."""
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params(args, RequestOutputKind.CUMULATIVE), use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / (time.perf_counter() - start), time.process_time() - cpu


async def run_async(
    engine: AsyncLLM, prompts: list[list[int]], args: argparse.Namespace, tag: str
) -> tuple[float, float, float]:
    """(tokens/s, engine-process CPU s, front-end CPU s)."""

    async def one(i: int, prompt: list[int]) -> int:
        n = 0
        async for out in engine.generate(prompt, params(args, RequestOutputKind.DELTA), f"{tag}-{i}"):
            n += len(out.outputs[0].token_ids)
        return n

    pid = engine.engine_pid
    start, cpu, engine_cpu = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    seconds = time.perf_counter() - start
    return tokens / seconds, cpu_seconds(pid) - engine_cpu, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint dir or preset name")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="config overrides (after --)")
    args = p.parse_args()
    cfg = VllmConfig.from_dictconfig(config_from_kwargs(args.model, overrides=args.overrides))
    prompts = workload(args)
    llm = LLM.from_config(cfg)
    plain, shipped = [], []
    loop_cpu(llm.llm_engine, prompts[:2], args, ship=True)  # warm-up
    for _ in range(args.repeats):
        plain.append(loop_cpu(llm.llm_engine, prompts, args, ship=False))
        shipped.append(loop_cpu(llm.llm_engine, prompts, args, ship=True))
    a, b = statistics.median(plain), statistics.median(shipped)
    print(f"step-loop CPU s (median): LLM loop {a:.3f}, engine-process loop {b:.3f} ({(b / a - 1) * 100:+.1f}%)")
    engine = AsyncLLM(cfg)
    offline, online = [], []
    try:
        run_offline(llm, prompts[:2], args)  # warm-up both
        asyncio.run(run_async(engine, prompts[:2], args, "warm"))
        for r in range(args.repeats):
            offline.append(run_offline(llm, prompts, args))
            online.append(asyncio.run(run_async(engine, prompts, args, f"r{r}")))
            (a, a_cpu), (b, b_cpu, front_cpu) = offline[-1], online[-1]
            print(
                f"repeat {r}: LLM {a:.1f} tok/s ({a_cpu:.2f} CPU s) | AsyncLLM {b:.1f} tok/s "
                f"(engine {b_cpu:.2f} CPU s, front end {front_cpu:.2f} CPU s)",
                flush=True,
            )
    finally:
        engine.shutdown()
        llm.shutdown()
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    a, b = med(offline, 0), med(online, 0)
    print(f"median output tokens/s: LLM {a:.1f}, AsyncLLM {b:.1f} ({(b / a - 1) * 100:+.1f}%)")
    print(
        f"median step-loop CPU s: LLM {med(offline, 1):.2f}, AsyncLLM engine process {med(online, 1):.2f} "
        f"(+ front end {med(online, 2):.2f})"
    )


if __name__ == "__main__":
    main()

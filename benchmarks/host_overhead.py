"""The engine's own cost per decode step, with a model that costs almost nothing.

A 1-layer, hidden-32 Llama with a 256-token vocabulary (the demo model's
tokenizer, dummy weights) makes the forward pass nearly free, so what a step costs is the
engine's host path: scheduling, input preparation, sampling, the scheduler's
update and output processing (detokenizing). On a GPU that path runs while the
device waits (or, with overlap scheduling, behind the device's work), so it has
to fit inside one decode step of a real model (about 10 ms for Qwen3-0.6B over
256 requests on an H100).

Workload: N requests with short random prompts, 64 output tokens each (EOS
ignored, greedy, outputs asked for as ``LLM.generate`` does: final only), all
added at once with ``scheduler.max_num_seqs = N``; only
steps in which every request decodes one token are timed. Phases are timed by
wrapping the engine's own methods (a wrapper costs ~1 us, far below what it
measures)::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/host_overhead.py [--concurrency 1 64 256]

Prints one row per concurrency: ms per decode step and its split. On a machine
shared with other work, ``--cpu-time`` times the engine thread's CPU time
instead of wall time: it does not count waiting for a core.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch

from minivllm import RequestOutputKind, SamplingParams
from minivllm.config.store import build_config
from minivllm.engine.llm_engine import LLMEngine

TINY = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 256,
}
PHASES = ("schedule", "prepare", "model", "sample", "update", "outputs")


class PhaseClock:
    """Seconds spent in named phases during the current step. Phases nest: time
    spent in an inner wrapped call counts for the inner phase only."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.current: dict[str, float] = defaultdict(float)
        self.decode_only = False
        """Whether the step being timed scheduled one token for every request."""
        self._inner: list[float] = []
        """Per open wrapped call: time already claimed by calls nested in it."""

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        inner: Callable = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.clock()
            self._inner.append(0.0)
            try:
                return inner(*args, **kwargs)
            finally:
                total = self.clock() - start
                self.current[phase] += total - self._inner.pop()
                if self._inner:
                    self._inner[-1] += total

        setattr(obj, method, timed)

    @contextmanager
    def step(self) -> Iterator[dict[str, float]]:
        self.current = defaultdict(float)
        yield self.current


def build_engine(concurrency: int, overrides: list[str]) -> LLMEngine:
    tiny = ",".join(f"{k}:{v}" for k, v in TINY.items())
    cfg = build_config(
        overrides=[
            "load.format=dummy",
            "model.dtype=float32",
            f"+model.hf_overrides={{{tiny}}}",
            f"scheduler.max_num_seqs={max(concurrency, 1)}",
            "scheduler.max_num_batched_tokens=8192",
            "scheduler.log_stats_interval=0",
            f"cache.num_gpu_blocks_override={max(64, concurrency * 8)}",
            *overrides,
        ]
    )
    return LLMEngine(cfg)


def instrument(engine: LLMEngine, clock: PhaseClock) -> None:
    """Time the phases inside ``EngineCore.step``; 'outputs' is the rest of ``LLMEngine.step``."""
    core = engine.core
    runner = core.executor.worker.model_runner
    clock.wrap(core.scheduler, "update_from_output", "update")
    for obj, methods, phase in (
        (core.executor.worker, ("execute_model",), "sample"),  # a synchronous step: taking its output too
        (runner, ("execute_model", "execute_model_async"), "sample"),  # what the nested phases below leave
        (
            runner,
            ("_update_states", "_scheduled_rows", "_prepare_inputs", "_flat_tokens", "_attention_metadata"),
            "prepare",
        ),
        (runner, ("_forward",), "model"),
        (runner.model, ("compute_logits",), "model"),
    ):
        for method in methods:
            if hasattr(obj, method):
                clock.wrap(obj, method, phase)
    schedule = core.scheduler.schedule

    def observed_schedule() -> Any:
        sched = schedule()
        counts = sched.num_scheduled_tokens  # one token each iff the total equals the count (a C-speed sum)
        clock.decode_only = bool(counts) and sched.total_num_scheduled_tokens == len(counts)
        return sched

    core.scheduler.schedule = observed_schedule
    clock.wrap(core.scheduler, "schedule", "schedule")


def run(
    concurrency: int,
    output_len: int,
    overrides: list[str],
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
    cpu_time: bool = False,
) -> dict[str, float]:
    engine = build_engine(concurrency, overrides)
    clock = PhaseClock(time.thread_time if cpu_time else time.perf_counter)
    instrument(engine, clock)
    rng = np.random.default_rng(0)
    vocab = engine.cfg.hf_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, output_kind=output_kind)
    for _ in range(concurrency):
        prompt = rng.integers(10, vocab, size=int(rng.integers(8, 17))).tolist()
        engine.add_request(None, {"prompt_token_ids": prompt}, params)
    walls, phases = [], defaultdict(list)
    gc.collect()
    while engine.has_unfinished_requests():
        with clock.step() as spent:
            start = clock.clock()
            engine.step()
            wall = clock.clock() - start
        core_s = sum(spent[p] for p in PHASES if p != "outputs")
        if not clock.decode_only:
            continue
        walls.append(wall)
        for p in PHASES:
            phases[p].append(spent[p] if p != "outputs" else max(wall - core_s, 0.0))
    engine.shutdown()
    # The first decode steps still warm caches; the last ones run a shrinking batch.
    keep = slice(2, max(3, output_len - 4))
    row = {"step_ms": 1e3 * statistics.median(walls[keep])}
    row.update({p: 1e3 * statistics.median(v[keep]) for p, v in phases.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument(
        "--output-kind",
        default="FINAL_ONLY",
        choices=[k.name for k in RequestOutputKind],
        help="FINAL_ONLY as LLM.generate asks; DELTA as a streaming server does",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time this thread's CPU time instead of wall time (steady on a busy machine)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per concurrency; each column reports its smallest value (least disturbed)",
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides, e.g. scheduler.async_scheduling=true")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"{'requests':>8} {'ms/step':>8} " + " ".join(f"{p:>9}" for p in PHASES))
    for n in args.concurrency:
        rows = [
            run(n, args.output_len, args.overrides, RequestOutputKind[args.output_kind], args.cpu_time)
            for _ in range(args.repeat)
        ]
        row = {key: min(r[key] for r in rows) for key in rows[0]}
        print(f"{n:>8} {row['step_ms']:>8.3f} " + " ".join(f"{row[p]:>9.3f}" for p in PHASES))


if __name__ == "__main__":
    main()

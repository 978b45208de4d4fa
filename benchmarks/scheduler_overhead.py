"""The scheduler's own cost per decode step, without a model: ``schedule`` and
``update_from_output`` over N requests.

The workload of ``host_overhead.py`` (N requests of 8-16 random prompt tokens,
64 output tokens each, EOS ignored, block size 16, prefix caching on), with the
model replaced by a fixed sampled token and every token reported as it comes (as
when streaming; ``host_overhead.py`` asks for final outputs only): what remains is the scheduler's running
loop, block allocation and prefix-cache hashing (a block fills up or a new one is
needed about every 16 steps per request), building the step's output, and the
update loop. The engine's other phases do not run, so their noise on a shared
machine does not blur these two::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/scheduler_overhead.py [--concurrency 256] [--repeat 8]

Prints CPU ms per step (mean over the steps in which every request decodes, the
smallest over the repeats) for each phase.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from minivllm.config.store import build_config
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import Scheduler
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestId
from minivllm.sampling_params import SamplingParams


def build(concurrency: int) -> VllmConfig:
    return build_config(
        [
            "load.format=dummy",
            f"scheduler.max_num_seqs={concurrency}",
            "scheduler.max_num_batched_tokens=8192",
            "cache.block_size=16",
            "cache.enable_prefix_caching=true",
        ]
    )


def run(cfg: VllmConfig, concurrency: int, output_len: int) -> tuple[float, float]:
    """Mean CPU seconds of (schedule, update) over the steps where every request decodes."""
    scheduler = Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks=concurrency * 8))
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(concurrency):
        prompt = rng.integers(10, 256, size=int(rng.integers(8, 17))).tolist()
        scheduler.add_request(Request(RequestId(f"r{i}"), prompt, params, eos_token_id=None, max_tokens=output_len))
    schedule_s, update_s = [], []
    while scheduler.has_unfinished_requests():
        start = time.thread_time()
        out = scheduler.schedule()
        scheduled = time.thread_time()
        sampled = ModelRunnerOutput(sampled_token_ids={req_id: [7] for req_id in out.num_scheduled_tokens})
        before_update = time.thread_time()
        scheduler.update_from_output(out, sampled)
        end = time.thread_time()
        if out.total_num_scheduled_tokens == len(out.num_scheduled_tokens) == concurrency:
            schedule_s.append(scheduled - start)
            update_s.append(end - before_update)
    return statistics.mean(schedule_s), statistics.mean(update_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[256])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=8)
    args = parser.parse_args()
    print(f"{'requests':>8} {'schedule':>9} {'update':>9}   (CPU ms per decode step)")
    for concurrency in args.concurrency:
        cfg = build(concurrency)
        gc.collect()
        runs = [run(cfg, concurrency, args.output_len) for _ in range(args.repeat)]
        print(f"{concurrency:>8} {1e3 * min(r[0] for r in runs):>9.3f} {1e3 * min(r[1] for r in runs):>9.3f}")


if __name__ == "__main__":
    main()

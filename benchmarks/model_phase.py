"""The model phase of one decode step, replayed: attention ``prepare``, forward, logits.

``host_overhead.py`` times whole engine steps; on a machine shared with other work
its per-step numbers move by 2x within minutes, which hides changes of a few
percent in one phase. This script runs the same engine and workload
(``host_overhead.build_engine``: 1-layer hidden-32 Llama, N requests with short
prompts, greedy) until every request decodes, keeps the inputs of the last
step, and replays that step's model phase (``AttentionBackend.prepare``, the
forward pass, ``compute_logits``) many times: the smallest mean over rounds of a
few replays is the least disturbed. Each replay writes the same keys at the
same slots, so every one sees the same cache. With ``--count-ops`` it prints
how many aten ops one replay dispatches (a number that does not drift)::

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/model_phase.py --concurrency 1 256 [--count-ops]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_overhead import build_engine  # noqa: E402

from minivllm import RequestOutputKind, SamplingParams  # noqa: E402


def decode_step_replay(concurrency: int, warm_steps: int = 40) -> Callable[[], torch.Tensor]:
    """An engine after ``warm_steps`` steps, and a function replaying its last step's model phase."""
    engine = build_engine(concurrency, [])
    runner = engine.core.executor.worker.model_runner
    steps = []
    prepare_inputs = runner._prepare_inputs

    def keep(*args):
        steps.append(prepare_inputs(*args))
        return steps[-1]

    runner._prepare_inputs = keep
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    for _ in range(concurrency):
        prompt = rng.integers(10, 256, size=int(rng.integers(8, 17))).tolist()
        engine.add_request(None, {"prompt_token_ids": prompt}, params)
    for _ in range(warm_steps):
        engine.step()
    step = steps[-1]
    if step.meta.max_query_len != 1:
        raise RuntimeError(f"step {warm_steps} is not a decode step; lower warm_steps")

    @torch.inference_mode()
    def replay() -> torch.Tensor:
        step.meta.backend_data = runner.attn_backend.prepare(step.meta, runner.block_size)
        hidden = runner._forward(step.input_ids, step.positions, step.meta)
        return runner.model.compute_logits(hidden[step.logits_index])

    return replay


def smallest_ms(replay: Callable[[], torch.Tensor], rounds: int, per_round: int) -> float:
    """The smallest mean CPU time of ``per_round`` replays over ``rounds`` rounds."""
    for _ in range(per_round):
        replay()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(per_round):
            replay()
        best = min(best, (time.thread_time() - start) / per_round)
    return 1e3 * best


def aten_ops(replay: Callable[[], torch.Tensor]) -> tuple[int, int]:
    """(top-level, all) aten ops one replay dispatches."""
    with torch.profiler.profile() as prof:
        replay()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in events if e.cpu_parent is None), len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--per-round", type=int, default=15)
    parser.add_argument("--count-ops", action="store_true", help="also count the aten ops of one replay")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for n in args.concurrency:
        replay = decode_step_replay(n)
        line = f"requests {n:>4}: model phase {smallest_ms(replay, args.rounds, args.per_round):.3f} ms"
        if args.count_ops:
            top, everything = aten_ops(replay)
            line += f", aten ops {top} top-level / {everything} in all"
        print(line)


if __name__ == "__main__":
    main()

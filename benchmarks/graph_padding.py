"""Padded rows of CUDA-graph replays over nano-vllm's shrinking decode batch.

nano-vllm's benchmark runs 256 requests with output lengths uniform in [100, 1024]
(``random.seed(0)``); all of them decode together and the batch shrinks as they
finish. A decode step of ``B`` requests replays the smallest captured size ``N >= B``;
this prints the fraction of replayed rows that are padding, ``sum(N - B) / sum(N)``,
for the default capture sizes (``compilation.cudagraph_capture_sizes=null``) and for
the powers of two captured before::

    PYTHONPATH=. python benchmarks/graph_padding.py [--requests 256] [--max-num-seqs 256]

No device is needed: it counts rows, it does not time anything.
"""

from __future__ import annotations

import argparse
import bisect
import random

from minivllm.config.device import capture_sizes


def batch_trace(num_requests: int, seed: int = 0, low: int = 100, high: int = 1024) -> list[int]:
    """Decode batch size of each step when every request starts together and runs to its length."""
    rng = random.Random(seed)
    lengths = [rng.randint(low, high) for _ in range(num_requests)]
    return [sum(1 for n in lengths if n > step) for step in range(max(lengths))]


def padding_fraction(sizes: list[int], trace: list[int]) -> float:
    """Padded rows over replayed rows when each step pads to the next size in ``sizes`` (ascending)."""
    replayed = sum(sizes[bisect.bisect_left(sizes, b)] for b in trace)
    return (replayed - sum(trace)) / replayed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    args = parser.parse_args(argv)
    trace = batch_trace(args.requests)
    default = capture_sizes(None, args.max_num_seqs)
    powers = capture_sizes([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], args.max_num_seqs)
    print(f"{len(trace)} decode steps, mean batch {sum(trace) / len(trace):.1f}")
    for name, sizes in (("default (1, 2, 4, every 8)", default), ("powers of two", powers)):
        print(f"{name}: {len(sizes)} graphs, {100 * padding_fraction(sizes, trace):.2f}% padded rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

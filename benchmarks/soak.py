"""Soak and fault test of the HTTP server: 10 minutes (by default) of mixed traffic on
loopback, with structured outputs and tool calls (some cut short), random
disconnects, bad bodies, over-limit prompts and an occasional huge ``n``.

Starts ``python -m minivllm task=serve`` for the default demo model on a free
loopback port (or ``--launch MODEL_DIR``, extra ``key=value`` overrides after
``--``), watches the API server's and the engine's memory and open file
descriptors, counts tracebacks in the server's output, and prints a summary; exits 1
if the report lists a problem::

    OMP_NUM_THREADS=1 python benchmarks/soak.py --duration 120 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from minivllm.bench.soak import SoakConfig, count_tracebacks, run_soak

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import launch, process_tree  # noqa: E402 - the sibling benchmark script


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launch", metavar="MODEL_DIR", default="demo", help="checkpoint dir or preset (default: demo)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic, warm-up included")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending at once")
    p.add_argument("--max-tokens", type=int, default=16, help="upper bound of a normal request's max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat", action="store_true", help="the model has no chat template")
    p.add_argument("--result-json", type=Path, help="write the report here")
    p.add_argument("overrides", nargs="*", help="config overrides for the server (after --)")
    args = p.parse_args()
    tools = [] if args.no_chat else ["serve.tool_call_parser=hermes"]
    overrides = ["serve.host=127.0.0.1", *tools, *args.overrides]
    log: list[str] = []
    proc, base_url = launch(args.launch, overrides, log)
    try:
        pids = process_tree(proc.pid)
        cfg = SoakConfig(
            duration_s=args.duration,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            seed=args.seed,
            chat=not args.no_chat,
        )
        report = asyncio.run(run_soak(base_url, cfg, pids))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    report.tracebacks = count_tracebacks("".join(log))
    print(report.summary())
    if args.result_json:
        args.result_json.write_text(json.dumps(report.to_json(), indent=2))
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())

"""Tensor parallelism under torchrun: one engine per process (``external_launcher``).

Every process runs this same script with the same prompts and seeds; torchrun
gives each its rank. The engines stay in lockstep and each one gets the same
outputs; rank 0 prints them (and writes them as JSON with ``--out``)::

    torchrun --nproc-per-node 2 examples/torchrun_external_launcher.py --model path/to/hf_dir
    torchrun --nproc-per-node 2 examples/torchrun_external_launcher.py --model path/to/hf_dir \\
        --max-tokens 16 --override cache.block_size=8 --out outputs/tp2.json

This is how an RL framework that already runs one process per GPU (its
trainers) embeds the engine: no worker processes are spawned, and the
framework's process group is the engine's.
"""

from __future__ import annotations

import argparse
import json
import os

from minivllm import LLM, SamplingParams

PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def push(self"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or preset")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="the same on every rank")
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--override", action="append", default=[], help="a config override, e.g. cache.block_size=8")
    parser.add_argument("--out", default=None, help="rank 0 writes the outputs here as JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    llm = LLM(
        model=args.model,
        tensor_parallel_size=int(os.environ["WORLD_SIZE"]),
        distributed_executor_backend="external_launcher",
        seed=args.seed,
        overrides=args.override,
    )
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed, logprobs=args.logprobs
    )
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    if int(os.environ["RANK"]) == 0:  # every rank holds the same outputs; one reports them
        for out in outputs:
            print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
        if args.out:
            records = [
                {"prompt": o.prompt, "token_ids": o.outputs[0].token_ids, "logprobs": o.outputs[0].logprobs}
                for o in outputs
            ]
            with open(args.out, "w") as f:
                json.dump(records, f)
    llm.shutdown()


if __name__ == "__main__":
    main()

"""RL rollouts with weight sync: a trainer updates the weights of a running engine, twice.

A training process holds the policy as a Hugging Face model; the inference engine
generates rollouts from it. After each training step the trainer sends the new weights
to the engine without restarting it:

1. over a process group of their own (the trainer is member 0, each engine worker joins
   as 1, 2, ...): for every tensor the engine is told to receive ``update_weight(name,
   dtype, shape)`` while the trainer broadcasts it (gloo on the CPU, NCCL on GPUs);
2. by path: the trainer saves a safetensors checkpoint and the workers read it.

Between rollouts the engine sleeps (level 2: KV cache and weights freed) while the
trainer trains, and wakes for the next rollout. The worker methods come from a worker
extension (``worker_extension_cls``), called on every worker with ``collective_rpc``::

    python examples/rlhf_weight_sync.py                         # the bundled demo model, CPU
    python examples/rlhf_weight_sync.py --model path/to/hf_dir --tensor-parallel-size 2

Written as vLLM's RLHF example is, where the engine runs in a Ray actor and
``collective_rpc.remote`` returns at once; here the engine is in this process, so its
blocking ``collective_rpc`` runs in a thread while the trainer broadcasts.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.distributed.stateless_group import StatelessGroup

DEMO = Path(__file__).resolve().parents[1] / "minivllm" / "assets" / "demo-llama"
PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def push(self"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEMO), help="checkpoint directory (the demo model by default)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    return parser.parse_args()


def get_open_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_step(model: torch.nn.Module, seed: int) -> None:
    """Stands in for an optimizer step: every weight moves a little."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p) * 0.2 * p.float().std().to(p))


def print_rollouts(title: str, outputs) -> None:
    print(f"-- {title} " + "-" * 40)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")


def main() -> None:
    args = parse_args()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    train_model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)

    # The engine on the next devices (GPUs 1.. when there are GPUs), with the weight-sync methods mixed into its workers.
    llm = LLM(
        model=args.model,
        dtype="float32",
        tensor_parallel_size=args.tensor_parallel_size,
        worker_extension_cls="minivllm.worker.weight_update.WeightUpdateExtension",
        enable_sleep_mode=True,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
    )
    sampling_params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    print_rollouts("rollouts from the initial weights", llm.generate(PROMPTS, sampling_params, use_tqdm=False))

    # The weight-sync group: the trainer is member 0, the engine's workers 1 .. tp.
    master_address, master_port = "127.0.0.1", get_open_port()
    world_size = args.tensor_parallel_size + 1
    background = ThreadPoolExecutor(max_workers=1)
    handle = background.submit(
        llm.collective_rpc, "init_weight_update_group", args=(master_address, master_port, 1, world_size)
    )
    model_update_group = StatelessGroup.create(master_address, master_port, 0, world_size, device=device)
    handle.result()

    # Train while the engine sleeps: level 2 frees its KV cache and its weights.
    llm.sleep(level=2)
    train_step(train_model, seed=1)
    llm.wake_up(tags=["weights"])
    for name, p in train_model.named_parameters():  # checkpoint names: the engine fuses and shards them itself
        handle = background.submit(llm.collective_rpc, "update_weight", args=(name, str(p.dtype), tuple(p.shape)))
        model_update_group.broadcast(p.data.contiguous(), src=0)
        handle.result()
    llm.wake_up(tags=["kv_cache"])
    llm.reset_prefix_cache()  # nothing cached survived the sleep; after a sync without one, this drops stale KV
    print_rollouts("rollouts after the broadcast update", llm.generate(PROMPTS, sampling_params, use_tqdm=False))

    # The same by path: the trainer saves a checkpoint, the workers read it.
    train_step(train_model, seed=2)
    with tempfile.TemporaryDirectory() as tmp:
        train_model.save_pretrained(tmp)
        llm.collective_rpc("update_weights_from_path", args=(tmp,))
    llm.reset_prefix_cache()
    print_rollouts("rollouts after the update by path", llm.generate(PROMPTS, sampling_params, use_tqdm=False))

    # The engine runs the trainer's weights: the sums of its parameters agree (one rank holds them all at tp=1).
    trainer_sum = float(sum(p.detach().double().sum() for p in train_model.parameters()))
    engine_sums = llm.collective_rpc("weights_checksum")
    if args.tensor_parallel_size == 1:
        print(f"weights in sync: {abs(engine_sums[0] - trainer_sum) <= 1e-6 * max(1.0, abs(trainer_sum))}")

    handle = background.submit(llm.collective_rpc, "close_weight_update_group")
    model_update_group.close()
    handle.result()
    background.shutdown()
    llm.shutdown()


if __name__ == "__main__":
    main()

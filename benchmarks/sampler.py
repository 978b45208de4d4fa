"""Cost of one sampling step (the batch's SamplingMetadata + Sampler.forward) as the batch
grows, plain vs with every logit edit, at a real vocabulary size.

    python benchmarks/sampler.py [--vocab 32000] [--seq-len 512] [--repeats 20]

Prints the median milliseconds per step for each batch size and configuration.

    python benchmarks/sampler.py --fused [--vocab 151936] [--batches 1 64 256]

The fused Triton sampler against the torch path (``compilation.fused_sampler``) on the
device (CUDA when there is one), alternating the two, for greedy rows, temperature 0.6
(nano-vllm's bench workload) and top-p/k rows, on fp32 logits (what ``compute_logits``
gives) and bf16 logits (fused only). Without a GPU the kernel runs in Triton's interpreter
(set TRITON_INTERPRET=1) and its numbers say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.request import RequestId
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch

EDITS = dict(
    repetition_penalty=1.2,
    presence_penalty=0.5,
    frequency_penalty=0.3,
    logit_bias={7: 2.0, 11: -5.0},
    min_tokens=1000,
    max_tokens=2000,
    logprobs=5,
)
CONFIGS = {
    "greedy": dict(temperature=0),
    "greedy+edits": dict(temperature=0, **EDITS),
    "top-p/k": dict(temperature=0.8, top_p=0.9, top_k=50),
    "top-p/k+edits": dict(temperature=0.8, top_p=0.9, top_k=50, **EDITS),
}
"""edits: all three penalties, logit_bias, min_tokens (stop ids banned), two bad words, 5 logprobs."""


def _params(config: dict, vocab: int) -> SamplingParams:
    params = SamplingParams(**config)
    params._all_stop_token_ids = {2}
    if "min_tokens" in config:  # what the engine's processor fills in
        params._bad_words_token_ids = [[vocab - 1], [5, 6, 7]]
    return params


def step_ms(batch: int, config: dict, vocab: int, seq_len: int, repeats: int) -> float:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=gen)
    tokens = [torch.randint(0, vocab, (seq_len,), generator=gen).tolist() for _ in range(batch)]
    rows = InputBatch(batch, seq_len, 1, torch.device("cpu"))
    for i, ids in enumerate(tokens):
        rows.add(NewRequestData(RequestId(str(i)), ids, seq_len // 2, _params(config, vocab), [], 0))
    sampling_rows, seq_lens = np.arange(batch), np.full(batch, seq_len)
    sampler = Sampler(torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        meta = rows.sampling_metadata(sampling_rows, seq_lens, vocab)  # as a step's: edits rebuilt, the rest cached
        sampler(logits, meta)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[2:])


FUSED_CONFIGS = {
    "greedy": dict(temperature=0),
    "temp 0.6": dict(temperature=0.6),
    "top-p/k": dict(temperature=0.8, top_p=0.9, top_k=50),
}


def fused_vs_torch(batches: list[int], vocab: int, repeats: int) -> None:
    """Median ms of ``Sampler.forward`` per step, torch then fused (fp32, bf16 logits), alternating."""
    from minivllm.sample.metadata import SamplingRows

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        print("no GPU: the fused kernel runs in Triton's interpreter; these numbers mean nothing for a GPU")
    print(f"vocab {vocab} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    print(f"{'batch':>6} {'config':>9} {'torch fp32':>11} {'fused fp32':>11} {'fused bf16':>11} {'speed-up':>9}")
    for batch in batches:
        logits = torch.randn(batch, vocab, device=device, generator=torch.Generator(device).manual_seed(0))
        inputs = (logits, logits, logits.bfloat16())
        for name, config in FUSED_CONFIGS.items():
            rows = SamplingRows(batch, device)
            for i in range(batch):
                rows.set_row(i, SamplingParams(**config))
            meta = rows.metadata(np.arange(batch))
            samplers = [Sampler(torch.Generator(device).manual_seed(0), fused=f) for f in (False, True, True)]
            times = [[], [], []]
            for _ in range(repeats + 2):
                for i, (sampler, x) in enumerate(zip(samplers, inputs)):
                    times[i].append(_time_ms(sampler, x, meta, device))
            ms = [statistics.median(t[2:]) for t in times]
            print(f"{batch:>6} {name:>9} {ms[0]:>11.3f} {ms[1]:>11.3f} {ms[2]:>11.3f} {ms[0] / ms[1]:>8.2f}x")


def _time_ms(sampler: Sampler, logits: torch.Tensor, meta, device: torch.device) -> float:
    """One call's milliseconds: CUDA events on a GPU, the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sampler(logits, meta)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start_s = time.perf_counter()
    sampler(logits, meta)
    return 1e3 * (time.perf_counter() - start_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fused", action="store_true", help="the fused sampler against the torch path")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=512, help="prompt + output tokens per row (half each)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.fused:
        fused_vs_torch(args.batches, args.vocab, args.repeats)
        return
    print(f"vocab {args.vocab}, {args.seq_len} tokens per row, torch threads {torch.get_num_threads()}")
    print(f"{'batch':>6} " + " ".join(f"{name:>14}" for name in CONFIGS) + "   (ms per step, median)")
    for batch in args.batches:
        row = [step_ms(batch, c, args.vocab, args.seq_len, args.repeats) for c in CONFIGS.values()]
        print(f"{batch:>6} " + " ".join(f"{ms:>14.2f}" for ms in row))


if __name__ == "__main__":
    main()

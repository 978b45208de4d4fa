"""Beam search: the best ``beam_width`` continuations of each prompt.

python examples/offline_inference/beam_search.py --model facebook/opt-125m
"""

import argparse

from minivllm import LLM
from minivllm.sampling_params import BeamSearchParams


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="facebook/opt-125m")
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    return parser.parse_args()


def main(args):
    llm = LLM(model=args.model, num_gpu_blocks_override=args.num_gpu_blocks_override)
    params = BeamSearchParams(beam_width=args.beam_width, max_tokens=args.max_tokens)
    prompts = [{"prompt": "Hello, my name is "}, {"prompt": "The capital of France is"}]
    outputs = llm.beam_search(prompts, params)
    for prompt, output in zip(prompts, outputs):
        print(f"Prompt: {prompt['prompt']!r}")
        for i, sequence in enumerate(output.sequences):
            print(f"  beam {i}: {sequence.text!r} (cumulative logprob {sequence.cum_logprob:.3f})")


if __name__ == "__main__":
    main(parse_args())

"""Embeddings from a decoder-only embedding model (last-token pooling, normalized).

python examples/offline_inference/embed.py --model Qwen/Qwen3-Embedding-0.6B
"""

import argparse

from minivllm import LLM


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="Qwen/Qwen3-Embedding-0.6B")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    return parser.parse_args()


def main(args):
    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    llm = LLM(model=args.model, runner="pooling", num_gpu_blocks_override=args.num_gpu_blocks_override)
    outputs = llm.embed(prompts)

    print("\nGenerated Outputs:\n" + "-" * 60)
    for prompt, output in zip(prompts, outputs):
        embeds = output.outputs.embedding
        embeds_trimmed = (str(embeds[:16])[:-1] + ", ...]") if len(embeds) > 16 else embeds
        print(f"Prompt: {prompt!r} \nEmbeddings: {embeds_trimmed} (size={len(embeds)})")
        print("-" * 60)


if __name__ == "__main__":
    main(parse_args())

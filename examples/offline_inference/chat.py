"""Offline chat: one conversation, a batch of them, and a chat template of your own.

python examples/offline_inference/chat.py --model Qwen/Qwen3-0.6B
"""

import argparse

from minivllm import LLM, SamplingParams


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chat-template-path", default=None, help="a Jinja chat template file")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    return parser.parse_args()


def print_outputs(outputs):
    print("-" * 60)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}")
        print(f"Generated text: {output.outputs[0].text!r}")
        print("-" * 60)


def main(args):
    llm = LLM(model=args.model, num_gpu_blocks_override=args.num_gpu_blocks_override)
    sampling_params = SamplingParams(temperature=0.5, max_tokens=args.max_tokens)
    chat_template = None
    if args.chat_template_path is not None:
        with open(args.chat_template_path) as f:
            chat_template = f.read()

    conversation = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False, chat_template=chat_template)
    print_outputs(outputs)

    # A batch of conversations is one call.
    conversations = [conversation for _ in range(4)]
    outputs = llm.chat(conversations, sampling_params, use_tqdm=True, chat_template=chat_template)
    print_outputs(outputs)


if __name__ == "__main__":
    main(parse_args())

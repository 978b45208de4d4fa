"""Offline inference with an image: a prompt with the model's image token, and a chat
message with an image_url part (a base64 data URL).

python examples/offline_inference/vision_language.py --model llava-hf/llava-1.5-7b-hf
python examples/offline_inference/vision_language.py --model llava-hf/llava-1.5-7b-hf --image photo.jpg
"""

import argparse
import base64
import io

from PIL import Image

from minivllm import LLM, SamplingParams


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llava-hf/llava-1.5-7b-hf")
    parser.add_argument("--image", default=None, help="an image file (default: a generated gradient)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    return parser.parse_args()


def load_image(path):
    if path is not None:
        return Image.open(path).convert("RGB")
    return Image.linear_gradient("L").convert("RGB").resize((336, 336))


def data_url(image):
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def main(args):
    llm = LLM(model=args.model, num_gpu_blocks_override=args.num_gpu_blocks_override)
    sampling_params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    image = load_image(args.image)

    # A prompt in the model's own format, with one <image> token per image.
    prompt = "USER: <image>\nWhat is shown in this image? ASSISTANT:"
    outputs = llm.generate({"prompt": prompt, "multi_modal_data": {"image": image}}, sampling_params)
    print(f"Generated text: {outputs[0].outputs[0].text!r}")

    # The same through the chat template, with the image as an OpenAI image_url part.
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": "What is shown in this image?"},
            ],
        }
    ]
    outputs = llm.chat(messages, sampling_params)
    print(f"Chat reply: {outputs[0].outputs[0].text!r}")


if __name__ == "__main__":
    main(parse_args())

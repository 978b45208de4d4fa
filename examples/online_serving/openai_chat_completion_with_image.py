"""The OpenAI client sending an image (a base64 data URL) to the chat endpoint.

python -m minivllm task=serve model.path=llava-hf/llava-1.5-7b-hf
python examples/online_serving/openai_chat_completion_with_image.py --image photo.jpg
"""

import argparse
import base64
import mimetypes

from openai import OpenAI


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True, help="an image file")
    parser.add_argument("--base-url", default="http://localhost:8000/v1")
    args = parser.parse_args()

    mime = mimetypes.guess_type(args.image)[0] or "image/png"
    with open(args.image, "rb") as f:
        url = f"data:{mime};base64," + base64.b64encode(f.read()).decode()

    client = OpenAI(base_url=args.base_url, api_key="EMPTY")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        max_tokens=64,
    )
    print(reply.choices[0].message.content)


if __name__ == "__main__":
    main()

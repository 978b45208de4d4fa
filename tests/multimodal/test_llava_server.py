"""The OpenAI chat endpoint with images: the official client sending a base64 data URL
gets the offline engine's reply; /tokenize expands the image placeholders as generation does;
bad image data is a 400 and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.multimodal.llava_checkpoint import NUM_IMAGE_TOKENS, data_url, random_image

pytestmark = pytest.mark.slow  # an engine process of its own: about 20 s to start on a busy CPU


@pytest.fixture(scope="module")
def server(make_engine, llava_dir):
    return make_engine(llava_dir).start_server()


def _messages(url: str) -> list[dict]:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def test_chat_with_a_base64_image_equals_offline(client, llava_dir):
    image = random_image(21)
    reply = client.chat.completions.create(
        model=str(llava_dir), messages=_messages(data_url(image)), max_tokens=6, temperature=0.0
    )
    llm = LLM(str(llava_dir), max_model_len=256, num_gpu_blocks_override=32)
    offline = llm.chat(_messages(data_url(image)), SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert reply.choices[0].message.content == offline.outputs[0].text
    assert reply.usage.prompt_tokens == len(offline.prompt_token_ids)


def test_bad_image_data_is_a_400_and_the_server_keeps_serving(client, llava_dir):
    with pytest.raises(openai.BadRequestError, match="could not decode"):
        client.chat.completions.create(
            model=str(llava_dir), messages=_messages("data:image/png;base64,aGVsbG8="), max_tokens=2
        )
    with pytest.raises(openai.BadRequestError, match="no image was given"):
        client.chat.completions.create(
            model=str(llava_dir),
            messages=[{"role": "user", "content": [{"type": "text", "text": "<image> <image>"}]}],
            max_tokens=2,
        )
    ok = client.chat.completions.create(
        model=str(llava_dir), messages=_messages(data_url(random_image(22))), max_tokens=3, temperature=0.0
    )
    assert ok.usage.completion_tokens == 3


def test_tokenize_chat_with_an_image_gives_the_ids_generation_uses(server, llava_dir):
    messages = _messages(data_url(random_image(23)))
    res = httpx.post(f"{server.base_url}/tokenize", json={"messages": messages}, timeout=30).json()
    llm = LLM(str(llava_dir), max_model_len=256, num_gpu_blocks_override=32)
    offline = llm.chat(messages, SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert res["tokens"] == list(offline.prompt_token_ids) and res["count"] == len(res["tokens"])
    assert res["tokens"].count(llm.llm_engine.processor.mm.image_token_id) == NUM_IMAGE_TOKENS

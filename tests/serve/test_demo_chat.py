"""Chat out of the box: the default (demo) model ships a ChatML-style chat template,
so a server started with no serve.chat_template answers /v1/chat/completions; the
answer is the plain completion of the template's rendering."""

from __future__ import annotations

import openai
import pytest

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A stack class, please."}]


@pytest.fixture(scope="module")
def server(make_engine):
    harness = make_engine("demo", dtype="float32", device="cpu", block_size=16, num_gpu_blocks_override=64)
    return harness.start_server()


def test_the_default_model_serves_chat(server):
    tokenizer = server.harness.engine.tokenizer
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<s><|im_start|>system\nYou write Python.<|im_end|>\n")
    assert rendered.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        chat = client.chat.completions.create(model=server.model_name, messages=MESSAGES, max_tokens=12, temperature=0)
        plain = client.completions.create(model=server.model_name, prompt=ids, max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text and plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids)

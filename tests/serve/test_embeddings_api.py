"""/v1/embeddings with the official openai client (float and base64) against LLM.embed,
which tests/pooling checks against transformers."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from minivllm import LLM
from tests.serve.harness import ENGINE_KWARGS

TEXTS = ["def fibonacci(n):", "import os\nimport sys\n"]


@pytest.fixture(scope="module")
def server(make_engine, llama_dir):
    harness = make_engine(llama_dir, **ENGINE_KWARGS, runner="pooling", hf_overrides={"is_matryoshka": True})
    return harness.start_server(served_model_name="tiny-embed")


@pytest.fixture(scope="module")
def offline(llama_dir):
    llm = LLM(str(llama_dir), **dict(ENGINE_KWARGS, runner="pooling", num_gpu_blocks_override=64))
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_embeddings_match_offline(client, offline, encoding_format):
    """None: the client asks for base64 itself and decodes it; "base64": the raw string comes back."""
    kwargs = {"encoding_format": encoding_format} if encoding_format else {}
    res = client.embeddings.create(model="tiny-embed", input=TEXTS, **kwargs)
    want = offline.embed(TEXTS, use_tqdm=False)
    assert [d.index for d in res.data] == [0, 1] and res.model == "tiny-embed"
    for got, ref in zip(res.data, want):
        vector = got.embedding
        if encoding_format == "base64":
            vector = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
        torch.testing.assert_close(torch.tensor(vector), torch.tensor(ref.outputs.embedding), atol=1e-5, rtol=0)
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(len(w.prompt_token_ids) for w in want)


def test_dimensions_token_ids_and_bad_input(client, server, offline):
    ids = offline.get_tokenizer().encode(TEXTS[0])
    res = client.embeddings.create(model="tiny-embed", input=[ids], dimensions=8)
    assert len(res.data[0].embedding) == 8
    assert sum(x * x for x in res.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    bad = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": [[10**7]]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    unknown = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": "x", "frobnicate": 1}, timeout=30)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "frobnicate"
    gen = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert gen.status_code == 400 and "pooling" in gen.json()["error"]["message"]


def test_an_input_filling_the_context_is_embedded_and_a_longer_one_refused(client, server, offline):
    """Pooling generates nothing: max_model_len tokens fit; one more is OpenAI's context-window error."""
    max_len = server.harness.cfg.max_model_len
    ids = [5 + i % 50 for i in range(max_len)]
    res = client.embeddings.create(model="tiny-embed", input=[ids])
    assert res.usage.prompt_tokens == max_len
    (want,) = offline.embed([{"prompt_token_ids": ids}], use_tqdm=False)
    torch.testing.assert_close(
        torch.tensor(res.data[0].embedding), torch.tensor(want.outputs.embedding), atol=1e-5, rtol=0
    )
    bad = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": [ids + [5]]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    assert bad.json()["error"]["message"].startswith(
        f"This model's maximum context length is {max_len} tokens. However, you requested {max_len + 1} tokens"
    )

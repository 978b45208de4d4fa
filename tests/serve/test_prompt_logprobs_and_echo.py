"""Completions return prompt logprobs, echo them with logprobs, honour truncate_prompt_tokens
and add_special_tokens; chat returns prompt logprobs. The oracle is the offline LLM."""

from __future__ import annotations

import httpx
import pytest

from minivllm import LLM, SamplingParams
from tests.serve.harness import ENGINE_KWARGS

PROMPT = "import os\nimport sys\n"


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


@pytest.fixture(scope="module")
def offline(llama_dir):
    llm = LLM(str(llama_dir), **{**ENGINE_KWARGS, "num_gpu_blocks_override": 64})
    yield llm
    llm.shutdown()


def _complete(server, **body) -> dict:
    res = httpx.post(f"{server.base_url}/v1/completions", json={"temperature": 0, "max_tokens": 3, **body}, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def test_prompt_logprobs_are_returned_in_vllm_shape(server, offline):
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2), use_tqdm=False)[0]
    got = _complete(server, prompt=PROMPT, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(want.prompt_token_ids)
    for entry, ref in zip(got[1:], want.prompt_logprobs[1:]):
        assert {int(t) for t in entry} == set(ref)
        for t, lp in ref.items():
            assert entry[str(t)]["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
            assert entry[str(t)]["rank"] == lp.rank and entry[str(t)]["decoded_token"] == lp.decoded_token


def test_echo_with_logprobs_puts_the_prompt_first(server, offline):
    ids = offline.get_tokenizer().encode(PROMPT)
    want = offline.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1, logprobs=1), use_tqdm=False
    )[0]
    choice = _complete(server, prompt=PROMPT, echo=True, logprobs=1)["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(PROMPT) and len(lp["tokens"]) == len(ids) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = [e[t].logprob for e, t in zip(want.prompt_logprobs[1:], ids[1:])]
    ref += [e[t].logprob for e, t in zip(want.outputs[0].logprobs, want.outputs[0].token_ids)]
    assert lp["token_logprobs"][1:] == pytest.approx(ref, abs=1e-4)
    assert choice["prompt_logprobs"] is None  # not asked for explicitly


def test_truncate_prompt_tokens(server, offline):
    ids = offline.get_tokenizer().encode(PROMPT)
    res = _complete(server, prompt=PROMPT, truncate_prompt_tokens=3)
    tail = offline.generate(
        {"prompt_token_ids": ids[-3:]}, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False
    )[0]
    assert res["usage"]["prompt_tokens"] == 3 and res["choices"][0]["text"] == tail.outputs[0].text


@pytest.fixture
def bos_adding_tokenizer(server):
    """The server's tokenizer, made to prepend BOS (the test tokenizer adds no special tokens)."""
    from tokenizers.processors import TemplateProcessing

    backend = server.harness.engine.tokenizer.backend_tokenizer
    before = backend.post_processor
    backend.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    yield server.harness.engine.tokenizer
    backend.post_processor = before


def test_add_special_tokens(server, bos_adding_tokenizer):
    with_bos = bos_adding_tokenizer.encode(PROMPT)
    assert with_bos[0] == 1 and with_bos[1:] == bos_adding_tokenizer.encode(PROMPT, add_special_tokens=False)
    assert _complete(server, prompt=PROMPT)["usage"]["prompt_tokens"] == len(with_bos)
    assert _complete(server, prompt=PROMPT, add_special_tokens=False)["usage"]["prompt_tokens"] == len(with_bos) - 1
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}  # the template adds no BOS
    counts = [
        httpx.post(f"{server.base_url}/v1/chat/completions", json={**chat, **extra}, timeout=60).json()["usage"]
        for extra in ({}, {"add_special_tokens": True})
    ]
    assert counts[0]["prompt_tokens"] == len(with_bos) - 1 and counts[1]["prompt_tokens"] == len(with_bos)


def test_chat_returns_prompt_logprobs(server):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0}
    res = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60).json()
    plp = res["prompt_logprobs"]
    assert plp[0] is None and len(plp) == res["usage"]["prompt_tokens"]
    assert all(len(entry) == 1 for entry in plp[1:])

"""The official openai client against the server: completions, streaming, logprobs,
usage, n, batches and vLLM's extra parameters. The oracle is the offline LLM."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.serve.harness import ENGINE_KWARGS

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(served_model_name="tiny-llama")


@pytest.fixture(scope="module")
def offline(llama_dir):
    llm = LLM(str(llama_dir), **{**ENGINE_KWARGS, "num_gpu_blocks_override": 64})
    yield llm
    llm.shutdown()


def reference(llm: LLM, prompt: str, max_tokens: int, **kw):
    return llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **kw), use_tqdm=False)[0]


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    assert models.data[0].model_extra["max_model_len"] == server.harness.cfg.max_model_len
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_completion_matches_offline_and_counts_usage(client, offline):
    want = reference(offline, PROMPT, 10)
    res = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=10, temperature=0)
    assert res.choices[0].text == want.outputs[0].text
    assert res.choices[0].finish_reason == "length"
    assert res.usage.prompt_tokens == len(want.prompt_token_ids)
    assert res.usage.completion_tokens == len(want.outputs[0].token_ids) == 10
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens


def test_token_id_prompt_and_batch_of_prompts(client, offline):
    prompts = [PROMPT, "import os\n"]
    wants = [reference(offline, p, 6) for p in prompts]
    res = client.completions.create(model="tiny-llama", prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in res.choices] == [0, 1]
    assert [c.text for c in res.choices] == [w.outputs[0].text for w in wants]
    assert res.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in wants)
    by_ids = client.completions.create(
        model="tiny-llama", prompt=wants[1].prompt_token_ids, max_tokens=6, temperature=0
    )
    assert by_ids.choices[0].text == wants[1].outputs[0].text


def test_stream_text_equals_non_streamed_text(client):
    full = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model="tiny-llama",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) > 1
    assert "".join(c.choices[0].text for c in text_chunks) == full.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in text_chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_logprobs_match_offline(client, offline):
    want = reference(offline, PROMPT, 6, logprobs=3).outputs[0]
    res = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = res.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == res.usage.completion_tokens
    assert lp.token_logprobs == pytest.approx([ref[t] for t, ref in zip(want.token_ids, want.logprobs)], abs=1e-4)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 4  # top 3, plus the chosen token when it is not among them
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the most likely
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_vllm_parameters_at_the_top_level(client, offline):
    greedy = reference(offline, PROMPT, 8).outputs[0].text
    # top_k=1 leaves only the most likely token: sampling at temperature 1 is then greedy.
    res = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body={"top_k": 1}
    )
    assert res.choices[0].text == greedy
    stop = greedy[3:6]
    assert len(stop) == 3
    cut = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert cut.choices[0].text == greedy[: greedy.index(stop) + len(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_echo_prepends_the_prompt(client):
    plain = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0)
    echoed = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text


def test_n_completions_match_offline(client, offline):
    """n=2 with a seed: the two seeded completions the offline engine gives, as choices 0 and 1."""
    params = SamplingParams(temperature=0.8, max_tokens=6, n=2, seed=1, logprobs=0)
    want = offline.generate(PROMPT, params, use_tqdm=False)[0].outputs
    res = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=6, temperature=0.8, n=2, seed=1, logprobs=0
    )
    assert sorted(c.index for c in res.choices) == [0, 1]
    assert [c.text for c in sorted(res.choices, key=lambda c: c.index)] == [w.text for w in want]
    assert res.usage.completion_tokens == sum(len(w.token_ids) for w in want) == 12
    for c in res.choices:
        assert len(c.logprobs.tokens) == 6 and all(math.isfinite(x) for x in c.logprobs.token_logprobs)


def test_chat_without_a_template_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 400
    assert info.value.body["param"] == "messages"
    assert "chat template" in info.value.body["message"] and "serve.chat_template" in info.value.body["message"]

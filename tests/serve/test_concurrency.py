"""64 concurrent streaming clients: each gets the text a lone client gets, and the
Prometheus counters add up to what the clients received."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

NUM_CLIENTS = 64
MAX_TOKENS = 8
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "    for i in range("]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server()


async def stream_one(client: openai.AsyncOpenAI, model: str, prompt: str) -> tuple[str, int, int, int]:
    """(text, chunks with text, prompt tokens, completion tokens) of one streamed request."""
    text, chunks, usage = "", 0, None
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
    return text, chunks, usage.prompt_tokens, usage.completion_tokens


async def run_clients(base_url: str, prompts: list[str]) -> list[tuple[str, int, int, int]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=NUM_CLIENTS)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", http_client=http, max_retries=0)
        model = (await client.models.list()).data[0].id
        return await asyncio.wait_for(asyncio.gather(*(stream_one(client, model, p) for p in prompts)), timeout=180)


def test_64_streaming_clients_get_what_one_client_gets(server):
    alone = {p: asyncio.run(run_clients(server.base_url, [p]))[0] for p in PROMPTS}
    before = server.metrics()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_CLIENTS)]
    results = asyncio.run(run_clients(server.base_url, prompts))
    after = server.metrics()

    for prompt, (text, chunks, n_prompt, n_out) in zip(prompts, results):
        assert text == alone[prompt][0], prompt
        assert (n_prompt, n_out) == alone[prompt][2:]
        assert n_out == MAX_TOKENS and chunks >= 1

    def delta(name: str, **labels: str) -> float:
        want = set(labels.items())
        total = lambda snap: sum(v for (n, ls), v in snap.items() if n == name and want <= ls)  # noqa: E731
        return total(after) - total(before)

    prompt_tokens = sum(r[2] for r in results)
    assert delta("vllm:request_success_total", finished_reason="length") == NUM_CLIENTS
    assert delta("vllm:prompt_tokens_total") == prompt_tokens
    assert delta("vllm:generation_tokens_total") == NUM_CLIENTS * MAX_TOKENS
    assert delta("vllm:time_to_first_token_seconds_count") == NUM_CLIENTS
    assert delta("vllm:e2e_request_latency_seconds_count") == NUM_CLIENTS
    assert delta("vllm:inter_token_latency_seconds_count") == NUM_CLIENTS * (MAX_TOKENS - 1)
    assert delta("vllm:request_prompt_tokens_sum") == prompt_tokens
    assert delta("vllm:http_requests_total", route="/v1/completions", status="200") == NUM_CLIENTS
    assert after[("vllm:num_requests_running", frozenset({("model_name", server.model_name)}))] == 0
    assert after[("vllm:kv_cache_usage_perc", frozenset({("model_name", server.model_name)}))] == 0.0

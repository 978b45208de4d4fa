"""The disaggregated-prefill proxy in front of a prefill server (kv_producer) and a decode server
(kv_consumer) sharing KV through a directory: an OpenAI client sees an ordinary server, the
decode engine loads the prompt's KV instead of computing it, and a dead prefill server costs a
503 naming it, never a wrong answer. The oracle is one engine doing both."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from minivllm.distributed.utils import get_open_port
from minivllm.serve.disagg_proxy import build_proxy_app, prefill_body
from tests.serve.harness import ENGINE_KWARGS

PROMPT = "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n"


def _kv(path, role):
    extra = {"shared_storage_path": str(path)}
    return {"kv_connector": "SharedStorageConnector", "kv_role": role, "kv_connector_extra_config": extra}


@pytest.fixture(scope="module")
def servers(llama_dir, make_engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("kv")
    single = make_engine(llama_dir, **ENGINE_KWARGS).start_server()
    prefill = make_engine(llama_dir, **ENGINE_KWARGS, kv_transfer_config=_kv(path, "kv_producer"))
    decode = make_engine(llama_dir, **ENGINE_KWARGS, kv_transfer_config=_kv(path, "kv_consumer"))
    return single, prefill.start_server(), decode, decode.start_server(), path


def test_prefill_body_asks_for_one_token_without_a_stream():
    body = {"prompt": "x", "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True}}
    assert prefill_body(body) == {
        "prompt": "x",
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    assert prefill_body({"messages": [], "max_completion_tokens": 5})["max_completion_tokens"] == 1


def test_an_openai_client_against_the_proxy(servers):
    import openai

    single, prefill, _, decode, path = servers
    request = dict(model=single.model_name, prompt=PROMPT, max_tokens=8, temperature=0)
    want = openai.OpenAI(base_url=single.base_url + "/v1", api_key="x").completions.create(**request)
    with TestClient(build_proxy_app([prefill.base_url], [decode.base_url])) as http:
        client = openai.OpenAI(base_url="http://proxy/v1", api_key="x", http_client=http)
        got = client.completions.create(**request)
        streamed = "".join(c.choices[0].text for c in client.completions.create(**request, stream=True))
    assert got.choices[0].text == want.choices[0].text == streamed
    assert list(path.glob("*.kv"))  # the prefill server saved the prompt's blocks
    assert decode.metric("vllm:external_prefix_cache_hits_total") > 0  # the decode server loaded them


def test_a_dead_prefill_server_is_skipped_then_a_503(servers):
    single, prefill, _, decode, _ = servers
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    body = dict(model=single.model_name, prompt="def f(x):", max_tokens=4, temperature=0)
    with TestClient(build_proxy_app([dead, prefill.base_url], [decode.base_url])) as http:
        assert http.post("/v1/completions", json=body).status_code == 200  # the next one took it
        assert http.post("/v1/completions", json=body).status_code == 200
    with TestClient(build_proxy_app([dead], [decode.base_url])) as http:
        reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 503 and dead in reply.json()["error"]["message"]


def test_a_bad_request_comes_back_from_the_prefill_server(servers):
    _, prefill, _, decode, _ = servers
    with TestClient(build_proxy_app([prefill.base_url], [decode.base_url])) as http:
        reply = http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert 400 <= reply.status_code < 500


@pytest.fixture(scope="module")
def p2p_servers(llama_dir, make_engine):
    producer = {"kv_connector": "P2pConnector", "kv_role": "kv_producer", "kv_port": get_open_port()}
    prefill = make_engine(llama_dir, **ENGINE_KWARGS, kv_transfer_config=producer)
    decode = make_engine(
        llama_dir, **ENGINE_KWARGS, kv_transfer_config={"kv_connector": "P2pConnector", "kv_role": "kv_consumer"}
    )
    return prefill.start_server(), decode.start_server()


def test_point_to_point_through_the_proxy(servers, p2p_servers):
    """The prefill answer's kv_transfer_params reach the decode server, whose engine pulls
    the prompt's KV from the prefill engine's process (whole answers and streams)."""
    import openai

    single = servers[0]
    prefill, decode = p2p_servers
    request = dict(model=single.model_name, prompt=PROMPT, max_tokens=8, temperature=0)
    want = openai.OpenAI(base_url=single.base_url + "/v1", api_key="x").completions.create(**request)
    with TestClient(build_proxy_app([prefill.base_url], [decode.base_url])) as http:
        client = openai.OpenAI(base_url="http://proxy/v1", api_key="x", http_client=http)
        got = client.completions.create(**request)
        hits = decode.metric("vllm:external_prefix_cache_hits_total")
        streamed = "".join(c.choices[0].text for c in client.completions.create(**request, stream=True))
    assert got.choices[0].text == want.choices[0].text == streamed
    assert hits == (want.usage.prompt_tokens - 1) // 8 * 8 > 0  # the decode engine pulled the prompt's blocks
    assert decode.metric("vllm:external_prefix_cache_hits_total") == hits  # the stream: its own cache had them


def test_a_prefill_answer_carries_kv_transfer_params(p2p_servers):
    import httpx

    prefill, _ = p2p_servers
    reply = httpx.post(prefill.base_url + "/v1/completions", json=prefill_body({"prompt": PROMPT, "max_tokens": 5}))
    params = reply.json()["kv_transfer_params"]
    assert params["remote_port"] > 0 and params["remote_block_size"] == 8 and params["remote_block_hashes"]


def test_a_prefill_engine_gone_before_the_pull_costs_no_answer(servers, p2p_servers):
    """The decode server is given params whose producer cannot be reached any more (its
    port now dead): its engine reports the blocks as not loaded and computes the prompt."""
    import httpx

    single = servers[0]
    prefill, decode = p2p_servers
    prompt = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    body = {"model": single.model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    want = httpx.post(single.base_url + "/v1/completions", json=body).json()["choices"][0]["text"]
    params = httpx.post(prefill.base_url + "/v1/completions", json=prefill_body(body)).json()["kv_transfer_params"]
    hits = decode.metric("vllm:external_prefix_cache_hits_total")
    dead = {**params, "remote_port": get_open_port()}
    reply = httpx.post(decode.base_url + "/v1/completions", json={**body, "kv_transfer_params": dead}, timeout=120)
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == want
    assert decode.metric("vllm:external_prefix_cache_hits_total") == hits  # nothing counted as loaded

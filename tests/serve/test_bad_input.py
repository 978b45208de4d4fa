"""Bad requests get a 400 naming the field (never a 500) and the server keeps serving;
a client that hangs up has its request aborted and its KV blocks freed."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from tokenizers.processors import TemplateProcessing


@pytest.fixture(scope="module")
def server(start_server):
    return start_server()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def too_long_prompt(server) -> list[int]:
    return [5] * server.harness.cfg.max_model_len


BAD_COMPLETIONS = [
    # (body, param the error names, words the message must hold)
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens", ["integer"]),
    ({"prompt": "x", "temperature": "hot"}, "temperature", ["number"]),
    ({"prompt": 5}, "prompt", []),
    ({"prompt": "x", "stop": 3}, "stop", []),
    ({"prompt": "x", "stream": "sometimes"}, "stream", ["boolean"]),
    ({"max_tokens": 4}, "prompt", ["Field required"]),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", ["[1, inf)"]),
    ({"prompt": "x", "temperature": -1}, "temperature", []),
    ({"prompt": "x", "top_p": 2}, "top_p", []),
    ({"prompt": "x", "top_k": -7}, "top_k", []),
    ({"prompt": "x", "n": 0}, "n", []),
    ({"prompt": "x", "n": True}, "n", ["integer"]),
    ({"prompt": "x", "n": 2.0}, "n", ["integer"]),
    ({"prompt": "x", "max_tokens": True}, "max_tokens", ["integer"]),
    ({"prompt": "x", "temperature": False}, "temperature", ["boolean"]),
    ({"prompt": "x", "logprobs": 1000}, "logprobs", ["max_logprobs"]),
    ({"prompt": [10_000]}, "prompt", ["vocabulary"]),
    ({"prompt": []}, "prompt", ["empty"]),
    ({"prompt": ""}, "prompt", ["tokenizes to no tokens", "decoder prompt cannot be empty"]),  # no BOS token
    ({"prompt": [[]]}, "prompt", ["prompt_token_ids: is empty", "decoder prompt cannot be empty"]),
    ({"prompt": "x", "suffix": "y"}, "suffix", ["not implemented"]),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", ["stream"]),
    ({"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params", ["no KV connector"]),
]


@pytest.mark.parametrize(
    "body,param,words", BAD_COMPLETIONS, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_COMPLETIONS)]
)
def test_bad_completion_request_is_a_400_naming_the_field(http, body, param, words):
    res = http.post("/v1/completions", json=body)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].startswith(param)
    for word in words:
        assert word in error["message"]


def _context_message(max_len: int, prompt: int, completion: int, subject: str = "prompt") -> str:
    """OpenAI's and vLLM's wording, which litellm and LangChain recognise as a context-window error;
    a completion's input is its prompt, a chat request's its messages."""
    return (
        f"This model's maximum context length is {max_len} tokens. However, you requested {prompt + completion} "
        f"tokens ({prompt} in the {subject}, {completion} in the completion). "
        f"Please reduce the length of the {subject} or completion."
    )


def test_context_window_errors_are_a_400_in_openai_wording(server, http):
    max_len = server.harness.cfg.max_model_len
    res = http.post("/v1/completions", json={"prompt": too_long_prompt(server), "max_tokens": 4})
    assert res.status_code == 400 and res.json()["error"]["param"] == "prompt"
    assert res.json()["error"]["message"] == _context_message(max_len, max_len, 4)
    res = http.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 100_000})
    assert res.status_code == 400 and res.json()["error"]["param"] == "max_tokens"
    assert res.json()["error"]["message"] == _context_message(max_len, 3, 100_000)


def test_an_empty_prompt_is_served_when_the_tokenizer_adds_a_bos_token(server, http):
    """As in vLLM, an empty prompt is judged by its token ids: ``""`` is ``[bos]`` here."""
    tokenizer = server.harness.engine.tokenizer
    backend, bos = tokenizer.backend_tokenizer, tokenizer.bos_token
    before = backend.post_processor
    backend.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)])
    body = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    try:
        text = http.post("/v1/completions", json={**body, "prompt": ""})
        ids = http.post("/v1/completions", json={**body, "prompt": [tokenizer.bos_token_id]})
    finally:
        backend.post_processor = before
    assert text.status_code == 200 and ids.status_code == 200, (text.text, ids.text)
    assert text.json()["usage"]["prompt_tokens"] == 1
    assert text.json()["choices"][0]["text"] == ids.json()["choices"][0]["text"]
    assert text.json()["usage"]["completion_tokens"] == 3


def test_malformed_json_and_non_object_bodies(http):
    res = http.post("/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"})
    assert res.status_code == 400 and "malformed JSON" in res.json()["error"]["message"]
    res = http.post("/v1/completions", json=[1, 2])
    assert res.status_code == 400 and "JSON object" in res.json()["error"]["message"]


def test_bad_chat_requests(http):
    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "hi"}]}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ]:
        res = http.post("/v1/chat/completions", json=body)
        assert res.status_code == 400, (body, res.text)
        assert res.json()["error"]["param"] == param, body


def test_a_validator_message_comes_in_its_own_words(http):
    """A model validator's message is the error, without pydantic's "Value error, " before it."""
    res = http.post("/v1/chat/completions", json={"messages": [{"role": "tool"}]})
    assert res.status_code == 400, res.text
    assert res.json()["error"]["message"] == "messages: a tool message needs content (at messages[0])"


def test_server_keeps_serving_and_never_answered_500(server, http):
    res = http.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 3, "temperature": 0})
    assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 3
    assert http.get("/health").status_code == 200
    assert server.metric("vllm:http_requests_total", status="500") == 0
    assert server.metric("vllm:http_requests_total", status="400") >= len(BAD_COMPLETIONS)


def wait_for_idle_engine(server, free_blocks: float, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        free = server.metric("vllm:kv_cache_free_blocks")
        running = server.metric("vllm:num_requests_running")
        if (free, running) == (free_blocks, 0) or time.monotonic() > deadline:
            return {"free": free, "running": running}
        time.sleep(0.1)


def long_request(server, stream: bool) -> dict:
    room = server.harness.cfg.max_model_len - 16
    return {"prompt": "def f(x):", "max_tokens": room, "temperature": 0, "ignore_eos": True, "stream": stream}


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    start_free = server.metric("vllm:kv_cache_free_blocks")
    assert start_free == server.metric("vllm:kv_cache_total_blocks")
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=long_request(server, stream=True)) as res:
            lines = res.iter_lines()  # (dropping this iterator would close the connection)
            first = next(lines)
            assert server.metric("vllm:num_requests_running") == 1
        # leaving the block closes the connection mid-stream
    assert first.startswith("data: {")
    assert wait_for_idle_engine(server, start_free) == {"free": start_free, "running": 0}
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_disconnect_while_waiting_for_a_non_streamed_answer(server):
    """The client closes its socket while the answer is being generated: the request is aborted, its
    blocks freed, and the handler notes a 499. The tiny model decodes its whole room in a fraction of a
    second, so the request may finish before the close is seen: then it is tried again (up to 5 times)."""
    start_free = server.metric("vllm:kv_cache_free_blocks")
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    body = json.dumps(long_request(server, stream=False)).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            deadline = time.monotonic() + 30
            while server.metric("vllm:num_requests_running") != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.metric("vllm:num_requests_running") == 1
        # the socket is closed before any answer came
        assert wait_for_idle_engine(server, start_free) == {"free": start_free, "running": 0}
        if server.metric("vllm:request_success_total", finished_reason="abort") == aborted + 1:
            break
    else:
        pytest.fail("in 5 tries every request finished before its client's disconnect was seen")
    deadline = time.monotonic() + 30
    while server.metric("vllm:http_requests_total", status="499") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the handler notes the disconnect once its clean-up ran
    assert server.metric("vllm:http_requests_total", status="499") == 1
    assert server.metric("vllm:http_requests_total", status="500") == 0


def test_null_n_stream_and_echo_mean_their_defaults(http):
    """OpenAI's spec marks them nullable; clients that serialize every field send ``null``."""
    body = {"prompt": "x", "max_tokens": 2, "temperature": 0, "n": None, "stream": None, "echo": None}
    res = http.post("/v1/completions", json=body)
    assert res.status_code == 200, res.text
    plain = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0}).json()
    assert [c["text"] for c in res.json()["choices"]] == [c["text"] for c in plain["choices"]]
    assert res.headers["content-type"] == "application/json"  # not a stream

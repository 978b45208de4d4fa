"""The server fills the sampling fields a request leaves out from the checkpoint's generation
config (as vLLM does); fields the client sends win."""

from __future__ import annotations

from minivllm.serve.params import to_sampling_params
from minivllm.serve.protocol import ChatCompletionRequest, CompletionRequest

DEFAULTS = {"top_k": 1, "temperature": 0.9, "max_tokens": 3}


def test_defaults_fill_only_what_the_request_left_out():
    plain = to_sampling_params(CompletionRequest(prompt="x"), DEFAULTS, max_tokens=16)
    assert (plain.top_k, plain.temperature, plain.max_tokens) == (1, 0.9, 3)
    sent = CompletionRequest(prompt="x", temperature=0.0, max_tokens=5)
    params = to_sampling_params(sent, DEFAULTS, max_tokens=sent.max_tokens)
    assert (params.top_k, params.temperature, params.max_tokens) == (1, 0.0, 5)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_completion_tokens=7)
    assert to_sampling_params(chat, DEFAULTS, max_tokens=7).max_tokens == 7
    assert to_sampling_params(CompletionRequest(prompt="x"), None, max_tokens=16).max_tokens == 16

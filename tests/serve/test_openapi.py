"""/openapi.json tells the truth: the statuses each route answers (never 422), the
OpenAI error body, request bodies that forbid unknown fields, the numeric ranges the
engine enforces, response models, media types; and schemathesis finds nothing against it. Also: 405 keeps its Allow header,
a non-ASCII grammar is a plain 400, /tokenizer_info describes the tokenizer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from minivllm.sampling_params import RANGES as SAMPLING_RANGES
from minivllm.serve.protocol import ChatCompletionRequest, CompletionRequest


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}")


@pytest.fixture(scope="module")
def schema(server):
    return httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()


def test_statuses_and_error_bodies_are_documented_and_422_is_gone(schema):
    paths = schema["paths"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    for path, methods in paths.items():
        for method, op in methods.items():
            assert "422" not in op["responses"], (path, method)
    completions = paths["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "404", "408", "413", "503"} <= set(completions)
    error_ref = completions["400"]["content"]["application/json"]["schema"]["$ref"]
    assert error_ref.endswith("/ErrorResponse") and "Retry-After" in completions["503"]["headers"]
    assert "Retry-After" in paths["/health"]["get"]["responses"]["503"]["headers"]
    assert "401" not in completions  # no serve.api_key here
    for route in ("/tokenize", "/detokenize", "/v1/embeddings"):
        assert {"400", "404", "413"} <= set(paths[route]["post"]["responses"]), route


def test_media_types_and_response_models(schema):
    paths, components = schema["paths"], schema["components"]["schemas"]
    for route, model in (("/v1/completions", "CompletionResponse"), ("/v1/chat/completions", "ChatCompletionResponse")):
        content = paths[route]["post"]["responses"]["200"]["content"]
        assert content["application/json"]["schema"]["$ref"].endswith(f"/{model}")
        assert "text/event-stream" in content
        assert components[model]["properties"]["choices"]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert "content" not in paths["/health"]["get"]["responses"]["200"]
    for route, model in (("/v1/models", "ModelList"), ("/tokenize", "TokenizeResponse")):
        ok = paths[route].get("get", paths[route].get("post"))["responses"]["200"]
        assert ok["content"]["application/json"]["schema"]["$ref"].endswith(f"/{model}")
    for name in ("CompletionRequest", "ChatCompletionRequest", "ChatMessage", "TokenizeRequest", "EmbeddingRequest"):
        assert components[name]["additionalProperties"] is False, name
    # every public SamplingParams field is declared, so it is documented and accepted
    assert {"allowed_token_ids", "bad_words"} <= set(components["CompletionRequest"]["properties"])


def test_the_served_schema_states_the_engine_ranges(schema):
    """What tests/serve/test_request_ranges.py checks against the engine is what /openapi.json says."""
    components = schema["components"]["schemas"]
    for name, model in (("CompletionRequest", CompletionRequest), ("ChatCompletionRequest", ChatCompletionRequest)):
        served = components[name]["properties"]
        own = model.model_json_schema()["properties"]
        for field in SAMPLING_RANGES.keys() & served.keys():
            types = [served[field].get("anyOf", served[field]), own[field].get("anyOf", own[field])]
            assert types[0] == types[1], (name, field)
    top_p = components["CompletionRequest"]["properties"]["top_p"]["anyOf"][0]
    assert top_p == {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}


@pytest.mark.parametrize(
    "route, body, param, message",
    [
        ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p", "top_p=0: must be in (0.0, 1.0]"),
        ("/v1/completions", {"prompt": "x", "top_k": -2}, "top_k", "top_k=-2: must be -1 (disable), 0 (disable)"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
            "max_completion_tokens=0: must be in [1, inf)",
        ),
        ("/detokenize", {"tokens": [3, -1]}, "tokens", "tokens[1]=-1: must be in [0, inf)"),
    ],
)
def test_a_value_out_of_range_is_a_400_in_the_engine_words(server, route, body, param, message):
    res = httpx.post(f"{server.base_url}{route}", json=body, timeout=30)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == param and error["message"].startswith(message)


@pytest.mark.parametrize(
    "body, param, where",
    [
        ({"prompt": "x", "frobnicate": 1}, "frobnicate", "frobnicate"),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options", "x"),
    ],
)
def test_unknown_fields_are_a_400_naming_them(server, body, param, where):
    res = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert res.status_code == 400
    error = res.json()["error"]
    assert error["param"] == param and where in error["message"] and "unknown" in error["message"]


def test_a_non_text_content_part_is_refused_by_its_type(server):
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [part]}], "max_tokens": 1}
    res = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert res.status_code == 400
    error = res.json()["error"]
    assert error["param"] == "messages" and "only text" in error["message"] and "input_audio" in error["message"]


def test_allowed_token_ids_work_though_not_named_in_protocol(server):
    body = {"prompt": "x", "max_tokens": 3, "allowed_token_ids": [7], "ignore_eos": True}
    res = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert res.status_code == 200, res.text
    tokenizer = server.harness.engine.tokenizer
    assert res.json()["choices"][0]["text"] == tokenizer.decode([7, 7, 7])


def test_405_keeps_its_allow_header(server):
    res = httpx.delete(f"{server.base_url}/v1/completions", timeout=30)
    assert res.status_code == 405 and res.headers["allow"] == "POST"
    assert res.json()["error"]["code"] == 405


def test_a_non_ascii_grammar_cannot_be_compiled(server):
    body = {"prompt": "x", "max_tokens": 2, "guided_grammar": "root ::= é"}
    res = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == "guided_grammar" and "cannot be compiled" in error["message"]
    assert "codec" not in error["message"]


def test_tokenizer_info_describes_the_tokenizer(server, llama_dir):
    info = httpx.get(f"{server.base_url}/tokenizer_info", timeout=30).json()
    reference = AutoTokenizer.from_pretrained(str(llama_dir))
    assert info["tokenizer_class"] == type(reference).__name__
    assert info["vocab_size"] == len(reference)
    assert info["eos_token"] == reference.eos_token and info["eos_token_id"] == reference.eos_token_id
    assert info["bos_token"] == reference.bos_token and info["bos_token_id"] == reference.bos_token_id
    assert info["model_max_length"] == server.harness.cfg.max_model_len
    assert info["chat_template"] == server.app.state.server.chat_template


@pytest.mark.slow
def test_schemathesis_finds_nothing(server, tmp_path):
    exe = Path(sys.executable).with_name("schemathesis")
    if not exe.exists() and shutil.which("schemathesis") is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    cmd = [
        str(exe) if exe.exists() else "schemathesis",
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--phases",
        "fuzzing",
        "--max-examples",
        "3",
        "--seed",
        "1",
        "--workers",
        "1",
    ]
    env = {**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

"""/tokenize, /detokenize (prompt and chat messages), /version, /ping and /v1/models names;
the oracle is the tokenizer and LLM.chat's template rendering."""

from __future__ import annotations

import httpx
import pytest

import minivllm
from minivllm.entrypoints.chat_utils import render_chat

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ '\\n' }}{% endfor %}assistant:"
MESSAGES = [{"role": "user", "content": "def f(x):"}]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(served_model_name="tiny,alias", chat_template=TEMPLATE)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=30)


def test_tokenize_prompt_and_detokenize_round_trip(server):
    tok = server.harness.engine.tokenizer
    res = _post(server, "/tokenize", {"model": "alias", "prompt": "import os", "return_token_strs": True}).json()
    assert res["tokens"] == tok.encode("import os") and res["count"] == len(res["tokens"])
    assert res["max_model_len"] == server.harness.cfg.max_model_len
    assert res["token_strs"] == tok.convert_ids_to_tokens(res["tokens"])
    plain = _post(server, "/tokenize", {"prompt": "import os", "add_special_tokens": False}).json()
    assert plain["tokens"] == tok.encode("import os", add_special_tokens=False)
    back = _post(server, "/detokenize", {"model": "tiny", "tokens": plain["tokens"]}).json()
    assert back == {"prompt": "import os"}


def test_tokenize_chat_messages_uses_the_chat_template(server):
    tok = server.harness.engine.tokenizer
    res = _post(server, "/tokenize", {"messages": MESSAGES}).json()
    assert res["tokens"] == render_chat(tok, MESSAGES, chat_template=TEMPLATE)["prompt_token_ids"]


def test_bad_tokenize_and_detokenize_requests_are_400s_or_404s(server):
    both = _post(server, "/tokenize", {"prompt": "x", "messages": MESSAGES})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    bad = _post(server, "/detokenize", {"tokens": [10**7]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    wrong_model = _post(server, "/tokenize", {"model": "other", "prompt": "x"})
    assert wrong_model.status_code == 404 and wrong_model.json()["error"]["param"] == "model"
    unknown = _post(server, "/tokenize", {"prompt": "x", "frobnicate": 1})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "frobnicate"
    not_an_int = _post(server, "/detokenize", {"tokens": [1.5]})
    assert not_an_int.status_code == 400


def test_version_ping_and_model_names(server):
    assert httpx.get(f"{server.base_url}/version", timeout=10).json() == {"version": minivllm.__version__}
    assert httpx.get(f"{server.base_url}/ping", timeout=10).status_code == 200
    assert httpx.post(f"{server.base_url}/ping", timeout=10).status_code == 200
    models = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["tiny", "alias"]
    assert all(m["max_model_len"] == server.harness.cfg.max_model_len for m in models)

"""OpenAI fields the server does not implement (the protocol.UNIMPLEMENTED_* tables): at null or
their neutral value they are accepted and change nothing (the answer equals the one
without them); at any other value they are a 400 naming the field; /openapi.json lists
them, typed, saying so. A field nobody declares stays an unknown field."""

from __future__ import annotations

import httpx
import pytest

from minivllm.serve.protocol import UNIMPLEMENTED_CHAT, UNIMPLEMENTED_COMPLETIONS, UNIMPLEMENTED_EMBEDDINGS

CHAT_BODY = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4, "temperature": 0}
COMPLETION_BODY = {"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
ROUTES = {
    "/v1/chat/completions": (CHAT_BODY, UNIMPLEMENTED_CHAT),
    "/v1/completions": (COMPLETION_BODY, UNIMPLEMENTED_COMPLETIONS),
}

# A value asking for something, per field: every field of the tables needs one here.
ASKING = {
    "audio": {"voice": "alloy", "format": "wav"},
    "function_call": "auto",
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "metadata": {"team": "a"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "return a + b"},
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "service_tier": "flex",
    "store": True,
    "verbosity": "low",
    "web_search_options": {},
    "suffix": "    return a + b",
}
NEUTRAL_CASES = [
    (route, name, value)
    for route, (_, table) in ROUTES.items()
    for name, field in table.items()
    for value in (None, *field.neutral)
]
ASKING_CASES = [(route, name) for route, (_, table) in ROUTES.items() for name in table]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def plain(http):
    """Each route's answer to its body without any of the fields."""
    return {route: _answer(http, route, body) for route, (body, _) in ROUTES.items()}


def _answer(http: httpx.Client, route: str, body: dict) -> dict:
    res = http.post(route, json=body)
    assert res.status_code == 200, res.text
    answer = res.json()
    return {"choices": answer["choices"], "usage": answer["usage"]}


def test_every_field_has_a_value_asking_for_something():
    assert set(ASKING) == {*UNIMPLEMENTED_CHAT, *UNIMPLEMENTED_COMPLETIONS, *UNIMPLEMENTED_EMBEDDINGS}
    for name, value in ASKING.items():
        field = UNIMPLEMENTED_CHAT.get(name) or UNIMPLEMENTED_COMPLETIONS[name]
        assert value is not None and value not in field.neutral


@pytest.mark.parametrize("route, name, value", NEUTRAL_CASES, ids=[f"{c[1]}={c[2]!r}" for c in NEUTRAL_CASES])
def test_a_neutral_value_is_accepted_and_changes_nothing(http, plain, route, name, value):
    body = ROUTES[route][0]
    assert _answer(http, route, {**body, name: value}) == plain[route]


@pytest.mark.parametrize("route, name", ASKING_CASES, ids=[c[1] for c in ASKING_CASES])
def test_a_value_asking_for_something_is_a_400_naming_the_field(http, route, name):
    res = http.post(route, json={**ROUTES[route][0], name: ASKING[name]})
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == name
    assert error["message"].startswith(f"{name}: not implemented") and "accepted only as null" in error["message"]


def test_the_listed_fields_at_their_defaults_together_change_nothing(http, plain):
    """What SDKs and frameworks send, some of it implemented already (user, logit_bias,
    parallel_tool_calls, stream_options)."""
    defaults = {
        "functions": None,
        "function_call": None,
        "reasoning_effort": None,
        "metadata": None,
        "service_tier": None,
        "store": False,
        "parallel_tool_calls": True,
        "user": "someone",
        "safety_identifier": "someone",
        "logit_bias": None,
        "stream_options": None,
        "modalities": None,
        "audio": None,
        "prediction": None,
        "web_search_options": None,
    }
    assert _answer(http, "/v1/chat/completions", {**CHAT_BODY, **defaults}) == plain["/v1/chat/completions"]


@pytest.mark.parametrize(
    "route, body, name",
    [
        ("/v1/chat/completions", {**CHAT_BODY, "frobnicate": None}, "frobnicate"),
        ("/v1/completions", {**COMPLETION_BODY, "store": False}, "store"),  # a chat field, not a completions one
        ("/v1/embeddings", {"input": "x", "store": False}, "store"),
    ],
)
def test_an_unknown_field_is_still_a_400_naming_it(http, route, body, name):
    res = http.post(route, json=body)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == name and "unknown" in error["message"]


def test_openapi_lists_them_typed_and_says_what_is_accepted(http):
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    for model, table in (
        ("ChatCompletionRequest", UNIMPLEMENTED_CHAT),
        ("CompletionRequest", UNIMPLEMENTED_COMPLETIONS),
    ):
        properties = schemas[model]["properties"]
        for name in table:
            types = {t.get("type") for t in properties[name]["anyOf"]}
            assert "null" in types and len(types - {"null", None}) >= 1, properties[name]
            assert "Not implemented" in properties[name]["description"]
            assert "accepted only as null" in properties[name]["description"]


ECHOED = [
    {"role": "user", "content": "def add(a, b):"},
    {"role": "assistant", "content": "return a + b"},
    {"role": "user", "content": "def sub(a, b):"},
]


def test_an_openai_answer_appended_as_it_came_back_changes_nothing(http):
    """An OpenAI SDK's earlier answer carries refusal, audio and function_call at null and
    annotations empty; appended to the conversation, it renders as the plain message."""
    plain = _answer(http, "/v1/chat/completions", {**CHAT_BODY, "messages": ECHOED})
    echoed = [*ECHOED]
    echoed[1] = {**ECHOED[1], "refusal": None, "audio": None, "function_call": None, "annotations": []}
    assert _answer(http, "/v1/chat/completions", {**CHAT_BODY, "messages": echoed}) == plain


@pytest.mark.parametrize(
    "name, value", [("refusal", "I cannot help."), ("audio", {"id": "a1"}), ("annotations", [{"type": "url"}])]
)
def test_a_message_field_asking_for_something_is_a_400_naming_it(http, name, value):
    messages = [*ECHOED]
    messages[1] = {**ECHOED[1], name: value}
    res = http.post("/v1/chat/completions", json={**CHAT_BODY, "messages": messages})
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == "messages" and f"(at messages[1].{name})" in error["message"], error
    assert "not implemented" in error["message"], error

"""The soak's constrained and over-limit kinds (``bench/soak.py``), sent to chat
completions beside ``soak_traffic.py``'s plain traffic:

- ``structured`` / ``structured_stream``: a JSON schema, a regex or a choice
  (``response_format`` or ``structured_outputs``); a finished answer must satisfy it;
- ``tools`` / ``tools_stream``: ``tool_choice`` required, named or auto, with a
  ``max_tokens`` that cuts about a third of them short; a call's arguments must
  parse as JSON, and a choice cut short (``length``) must carry no calls;
- ``disconnect_tool_stream``: a tool stream the client hangs up on after its first event;
- ``too_long``: a prompt over the context, or a ``max_tokens`` that cannot fit: a 400
  in OpenAI's context-window wording;
- ``bad_params``: chat bodies with a bad constraint or tool field: a 400 naming it.

Half of the non-streamed requests go through the official ``openai`` client.
Every stream is read to its end by ``Traffic.read_stream`` (a finish_reason for
every choice, then ``[DONE]``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import openai

from minivllm.bench.soak_traffic import Traffic, Unexpected, parsed_body

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
REGEX = r"[a-z]{3,8}@[a-z]{2,5}\.com"
CHOICES = ["yes", "no", "maybe"]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
BAD_CHAT: list[tuple[dict[str, Any], str]] = [
    # (fields added to a chat body, the param the 400 must name)
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"temperature": -1}, "temperature"),
]
CONTEXT_ERROR = "This model's maximum context length is "


@dataclass
class ConstrainedTraffic:
    base: Traffic
    client: openai.AsyncOpenAI
    max_model_len: int

    def kinds(self) -> dict[str, tuple[float, Callable[[], Awaitable[str]]]]:
        return {
            "structured": (1.0, lambda: self.structured(stream=False)),
            "structured_stream": (1.0, lambda: self.structured(stream=True)),
            "tools": (1.0, lambda: self.tools(stream=False)),
            "tools_stream": (1.0, lambda: self.tools(stream=True)),
            "disconnect_tool_stream": (0.4, self.disconnect_tool_stream),
            "too_long": (0.6, self.too_long),
            "bad_params": (0.6, self.bad_params),
        }

    # ---- structured outputs -------------------------------------------------------------
    async def structured(self, stream: bool) -> str:
        rng = self.base.rng
        kind = rng.choice(["json", "regex", "choice"])
        extra: dict[str, Any] = {
            "json": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}},
            "regex": {"structured_outputs": {"regex": REGEX}},
            "choice": {"structured_outputs": {"choice": CHOICES}},
        }[kind]
        body = {**self._chat_body(rng.choice([4, 40])), **extra}
        choices = await self._chat(body, stream)
        for c in choices:
            if c["finish_reason"] == "stop":
                _check_structured(kind, c["content"])
        return "ok"

    # ---- tool calls -----------------------------------------------------------------------
    async def tools(self, stream: bool) -> str:
        rng = self.base.rng
        mode = rng.choice(["required", "named", "auto"])
        choice = {"type": "function", "function": {"name": "get_weather"}} if mode == "named" else mode
        body = {**self._chat_body(rng.choice([5, 80, 80])), "tools": [WEATHER, TIME], "tool_choice": choice}
        if mode == "required":
            body["parallel_tool_calls"] = False
        for c in await self._chat(body, stream):
            calls = c["tool_calls"]
            if c["finish_reason"] == "length":
                if calls:
                    raise Unexpected(f"tools ({mode}): a choice cut short carries tool calls: {calls}")
                self.base.stats["cut_short"] += 1
                continue
            if mode != "auto" and not calls:
                raise Unexpected(f"tools ({mode}): finished ({c['finish_reason']}) without a call: {c}")
            for call in calls:
                args = _json(call["arguments"])
                if not isinstance(args, dict) or call["name"] not in ("get_weather", "get_time"):
                    raise Unexpected(f"tools ({mode}): a bad call {call}")
                self.base.stats["tool_calls_parsed"] += 1
        return "ok"

    async def disconnect_tool_stream(self) -> str:
        body = {**self._chat_body(200), "tools": [WEATHER], "tool_choice": "required", "stream": True}
        async with self.base.http.stream("POST", "/v1/chat/completions", json=body) as res:
            if res.status_code != 200:
                raise Unexpected(f"tool stream: status {res.status_code}")
            async for _ in res.aiter_lines():
                break
        return "disconnected"

    # ---- over the limits ----------------------------------------------------------------------
    async def too_long(self) -> str:
        if self.base.rng.random() < 0.5:
            body = {"model": self.base.model, "prompt": [5] * self.max_model_len, "max_tokens": 4}
            param = "prompt"
        else:
            body = {"model": self.base.model, "prompt": [5, 6, 7], "max_tokens": self.max_model_len}
            param = "max_tokens"
        res = await self.base.http.post("/v1/completions", json=body)
        error = parsed_body(res).get("error") or {}
        if res.status_code != 400 or error.get("param") != param or not error["message"].startswith(CONTEXT_ERROR):
            raise Unexpected(f"too long ({param}): got {res.status_code}: {res.text[:200]}")
        return "refused"

    async def bad_params(self) -> str:
        extra, param = self.base.rng.choice(BAD_CHAT)
        res = await self.base.http.post("/v1/chat/completions", json={**self._chat_body(4), **extra})
        error = parsed_body(res).get("error") or {}
        if res.status_code != 400 or error.get("param") != param:
            raise Unexpected(f"bad chat field {param}: got {res.status_code}: {res.text[:200]}")
        return "refused"

    # ---- the exchange ---------------------------------------------------------------------------
    def _chat_body(self, max_tokens: int) -> dict[str, Any]:
        return {"model": self.base.model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 1.0}

    async def _chat(self, body: dict[str, Any], stream: bool) -> list[dict[str, Any]]:
        """Each choice as {finish_reason, content, tool_calls: [{name, arguments}]}."""
        if stream:
            async with self.base.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as res:
                if res.status_code != 200:
                    raise Unexpected(f"chat stream: status {res.status_code}: {(await res.aread())[:200]!r}")
                return _merge_deltas(await self.base.read_stream(res, 1))
        if self.base.rng.random() < 0.5:
            return await self._chat_openai(body)
        res = await self.base.http.post("/v1/chat/completions", json=body)
        if res.status_code != 200:
            raise Unexpected(f"chat: status {res.status_code}: {res.text[:200]}")
        return [_choice(c["finish_reason"], c["message"]) for c in parsed_body(res)["choices"]]

    async def _chat_openai(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        known = ("model", "messages", "max_tokens", "temperature", "tools", "tool_choice", "response_format")
        extra = {k: v for k, v in body.items() if k not in known}
        try:
            res = await self.client.chat.completions.create(
                **{k: v for k, v in body.items() if k in known}, extra_body=extra or None
            )
        except openai.APIError as err:
            raise Unexpected(f"chat (openai client): {type(err).__name__}: {err}") from None
        return [_choice(c.finish_reason, c.message.model_dump()) for c in res.choices]


def _choice(finish_reason: str | None, message: dict[str, Any]) -> dict[str, Any]:
    calls = [
        {"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
        for t in message.get("tool_calls") or []
    ]
    return {"finish_reason": finish_reason, "content": message.get("content") or "", "tool_calls": calls}


def _merge_deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    content, calls, reason = "", {}, None
    for event in events:
        for c in event["choices"]:
            delta = c.get("delta") or {}
            content += delta.get("content") or ""
            for t in delta.get("tool_calls") or []:
                entry = calls.setdefault(t["index"], {"name": "", "arguments": ""})
                entry["name"] += (t.get("function") or {}).get("name") or ""
                entry["arguments"] += (t.get("function") or {}).get("arguments") or ""
            reason = c.get("finish_reason") or reason
    return [{"finish_reason": reason, "content": content, "tool_calls": list(calls.values())}]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise Unexpected(f"not JSON ({err}): {text[:120]!r}") from None


def _check_structured(kind: str, content: str) -> None:
    if kind == "json" and not isinstance(_json(content), dict):
        raise Unexpected(f"json_schema: not an object: {content[:120]!r}")
    if kind == "regex" and not re.fullmatch(REGEX, content):
        raise Unexpected(f"regex: {content[:120]!r} does not match {REGEX}")
    if kind == "choice" and content not in CHOICES:
        raise Unexpected(f"choice: {content!r} not one of {CHOICES}")

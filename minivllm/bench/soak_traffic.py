"""The request kinds of the soak test (``bench/soak.py``), each one HTTP exchange
that ends in an outcome:

- ``ok``: a well-formed request answered in full (every choice finished);
- ``refused``: a bad request answered with the 4xx it deserves;
- ``overloaded``: a 503 (the server's queue limit; the client is told to retry);
- ``disconnected``: the client hung up on purpose (the server must abort it);
- ``unexpected``: anything else (a 500, a wrong status, a hang, a broken stream).

Kinds are drawn at random with fixed weights; a fault (disconnect, bad body,
huge ``n``) is about one request in three.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n", "for line in open("]
STOPS = [None, ["\n\n"], ["return", ")"]]
BAD_BODIES: list[tuple[dict[str, str], bytes, int]] = [
    # (headers, body, the status it deserves)
    ({"content-type": "application/json"}, b'{"prompt": "x", "max_tokens": ', 400),
    ({"content-type": "text/plain"}, b'{"prompt": "x"}', 400),
    ({"content-type": "application/json"}, b'{"prompt": "x", "n": true}', 400),
    ({"content-type": "application/json"}, b'{"prompt": "x", "model": "no-such-model"}', 404),
    ({"content-type": "application/json"}, b"[1, 2, 3]", 400),
]


class Unexpected(Exception):
    """The server answered something a well-behaved server never answers."""


@dataclass
class Traffic:
    http: httpx.AsyncClient
    model: str
    rng: random.Random
    max_tokens: int
    chat: bool
    """Whether the server has a chat template (chat kinds are sent only then)."""
    stats: Counter = field(default_factory=Counter)
    """streams (read to their end) and streams_complete (every choice finished, then ``[DONE]``)."""

    def kinds(self) -> dict[str, tuple[float, Callable[[], Awaitable[str]]]]:
        kinds = {
            "completion": (3.0, lambda: self.completion(stream=False)),
            "completion_stream": (3.0, lambda: self.completion(stream=True)),
            "disconnect_stream": (1.0, self.disconnect_stream),
            "disconnect_waiting": (1.0, self.disconnect_waiting),
            "bad_body": (1.5, self.bad_body),
            "huge_n": (0.3, self.huge_n),
        }
        if self.chat:
            kinds["chat"] = (1.5, lambda: self.chat_completion(stream=False))
            kinds["chat_stream"] = (1.5, lambda: self.chat_completion(stream=True))
        return kinds

    async def read_stream(self, res: httpx.Response, n: int) -> list[dict[str, Any]]:
        """A 200 stream's events, checked: no error event, a finish_reason for each of the
        ``n`` choices, and ``[DONE]`` last."""
        self.stats["streams"] += 1
        events, done = [], False
        async for line in sse_lines(res):
            if not line.startswith("data: "):
                continue
            if done:
                raise Unexpected(f"{res.request.url.path}: data after [DONE]: {line[:80]}")
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise Unexpected(f"error event in a stream: {event['error']}")
            events.append(event)
        finished = {c["index"] for e in events for c in e["choices"] if c.get("finish_reason")}
        if len(finished) != n or not done:
            raise Unexpected(
                f"{res.request.url.path}: stream ended with {len(finished)} of {n} choices finished, "
                f"{'with' if done else 'without'} [DONE]"
            )
        self.stats["streams_complete"] += 1
        return events

    # ---- well-formed requests ---------------------------------------------------------
    def _sampling(self, n: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "n": n, "max_tokens": self.rng.randint(1, self.max_tokens)}
        body["temperature"] = self.rng.choice([0.0, 0.8])
        if self.rng.random() < 0.5:
            body["seed"] = self.rng.randrange(1 << 20)
        stop = self.rng.choice(STOPS)
        if stop:
            body["stop"] = stop
        return body

    async def completion(self, stream: bool) -> str:
        n = self.rng.choice([1, 1, 2, 3])
        body = {**self._sampling(n), "prompt": self.rng.choice(PROMPTS), "stream": stream}
        return await self._exchange("/v1/completions", body, n)

    async def chat_completion(self, stream: bool) -> str:
        n = self.rng.choice([1, 2])
        messages = [{"role": "user", "content": self.rng.choice(PROMPTS)}]
        body = {**self._sampling(n), "messages": messages, "stream": stream}
        return await self._exchange("/v1/chat/completions", body, n)

    async def _exchange(self, path: str, body: dict[str, Any], n: int) -> str:
        if body["stream"]:
            async with self.http.stream("POST", path, json=body) as res:
                if res.status_code != 200:
                    await res.aread()
                    return _status_outcome(res)
                await self.read_stream(res, n)
                return "ok"
        res = await self.http.post(path, json=body)
        if res.status_code != 200:
            return _status_outcome(res)
        choices = parsed_body(res)["choices"]
        if len(choices) != n or any(c["finish_reason"] not in ("stop", "length") for c in choices):
            raise Unexpected(f"{path}: {res.text[:200]}")
        return "ok"

    # ---- faults -------------------------------------------------------------------------
    async def disconnect_stream(self) -> str:
        """Read the first event of a long stream, then hang up."""
        body = {
            "model": self.model,
            "prompt": self.rng.choice(PROMPTS),
            "max_tokens": 10 * self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        async with self.http.stream("POST", "/v1/completions", json=body) as res:
            if res.status_code != 200:
                await res.aread()
                return _status_outcome(res)
            async for _ in res.aiter_lines():
                break
        return "disconnected"

    async def disconnect_waiting(self) -> str:
        """Give up on a long non-streamed request after a short while (the connection closes)."""
        body = {
            "model": self.model,
            "prompt": self.rng.choice(PROMPTS),
            "max_tokens": 10 * self.max_tokens,
            "ignore_eos": True,
            "n": self.rng.choice([1, 2]),
        }
        try:
            res = await asyncio.wait_for(self.http.post("/v1/completions", json=body), self.rng.uniform(0.05, 0.5))
        except asyncio.TimeoutError:
            return "disconnected"
        return "ok" if res.status_code == 200 else _status_outcome(res)

    async def bad_body(self) -> str:
        headers, content, status = self.rng.choice(BAD_BODIES)
        res = await self.http.post("/v1/completions", content=content, headers=headers)
        if res.status_code != status or "error" not in res.json():
            raise Unexpected(f"bad body {content[:40]!r}: got {res.status_code}, wanted {status}")
        return "refused"

    async def huge_n(self) -> str:
        res = await self.http.post("/v1/completions", json={"model": self.model, "prompt": "x", "n": 100_000})
        if res.status_code != 400:
            raise Unexpected(f"n=100000: got {res.status_code}, wanted 400")
        return "refused"


def _status_outcome(res: httpx.Response) -> str:
    if res.status_code == 503 and "retry-after" in res.headers:
        return "overloaded"
    raise Unexpected(f"{res.request.url.path}: status {res.status_code}: {res.text[:200]}")


async def sse_lines(res: httpx.Response):
    """A server-sent event stream's lines, split where the SSE format ends a line (LF, CR
    or CRLF) and nowhere else: ``aiter_lines`` splits like ``str.splitlines``, also at
    U+0085, U+2028 and the like, which JSON carries unescaped inside generated text."""
    pending = b""
    async for chunk in res.aiter_bytes():
        lines = (pending + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        pending = lines.pop()  # the part after the last line end (a CR split from its LF is harmless: an empty line)
        for line in lines:
            yield line.decode()
    if pending:
        yield pending.decode()


def parsed_body(res: httpx.Response) -> dict[str, Any]:
    """A non-streamed answer's JSON body (Unexpected if it does not parse)."""
    try:
        return res.json()
    except ValueError as err:
        raise Unexpected(f"{res.request.url.path}: the body is not JSON ({err}): {res.text[:120]!r}") from None

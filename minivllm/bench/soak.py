"""A bounded soak and fault test of the HTTP server, on loopback.

    report = asyncio.run(run_soak("http://127.0.0.1:8000", SoakConfig(duration_s=600), pids))
    print(report.summary()); assert not report.problems()

``concurrency`` clients send mixed traffic for ``duration_s``. A warm-up phase
(``warmup_frac`` of the time) comes first; then the server is let go idle and its
processes' memory (RSS) and open file descriptors are measured, and again after the
traffic. The report's ``problems()`` lists what went wrong: any unexpected outcome, a
500 in /metrics, an engine not idle at the end (running, waiting, KV blocks in use), or
memory or descriptors that grew after warm-up, a stream that did not end with a
finish_reason for every choice and ``[DONE]``, or a traceback in the server's log
(``tracebacks``, counted by the caller with ``count_tracebacks``).

Each request kind is one HTTP exchange that ends in an outcome:

- ``ok``: a well-formed request answered in full (every choice finished);
- ``refused``: a bad request answered with the 4xx it deserves;
- ``overloaded``: a 503 (the server's queue limit; the client is told to retry);
- ``disconnected``: the client hung up on purpose (the server must abort it);
- ``unexpected``: anything else (a 500, a wrong status, a hang, a broken stream).

Kinds are drawn at random with fixed weights. The plain traffic (``Traffic``):
completions and chat, streamed and not, n > 1, stop strings, seeds; its faults
(random disconnects, bad bodies, an occasional huge ``n``) are about one request in
three. The constrained and over-limit kinds (``ConstrainedTraffic``), sent to chat
completions beside them:

- ``structured`` / ``structured_stream``: a JSON schema, a regex or a choice
  (``response_format`` or ``structured_outputs``); a finished answer must satisfy it;
- ``tools`` / ``tools_stream``: ``tool_choice`` required, named or auto, with a
  ``max_tokens`` that cuts about a third of them short; a call's arguments must
  parse as JSON, and a choice cut short (``length``) must carry no calls;
- ``disconnect_tool_stream``: a tool stream the client hangs up on after its first event;
- ``too_long``: a prompt over the context, or a ``max_tokens`` that cannot fit: a 400
  in OpenAI's context-window wording;
- ``bad_params``: chat bodies with a bad constraint or tool field: a 400 naming it.

Half of the non-streamed constrained requests go through the official ``openai``
client. Every stream is read to its end by ``Traffic.read_stream`` (a finish_reason
for every choice, then ``[DONE]``).

With ``images`` (a model that takes images), the image kinds (``ImageTraffic``), each a
chat request with one image, every image a new one (so a leak per distinct image shows
in the samples):

- ``image_data``: a ``data:`` URL;
- ``image_http``: an http URL to the loopback media server at ``media_url`` (it answers
  ``/pic/<n>.png``; the server must allow its host in ``serve.allowed_media_domains``);
- ``image_inward``: an http URL to ``[::1]`` (loopback, allowed by no configuration
  here): a 400 ``could not fetch``, refused before any connection;
- ``image_bomb``: a 12000 x 12000 PNG (a few hundred KB) as a data URL: a 400 naming
  ``serve.max_image_pixels``, answered at once.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import random
import re
import struct
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class SoakConfig:
    duration_s: float = 600.0
    """Traffic time in all, warm-up included."""
    concurrency: int = 8
    """Clients sending at once."""
    max_tokens: int = 16
    """Upper bound of a normal request's max_tokens (faults ask for 10x)."""
    warmup_frac: float = 0.2
    """Share of ``duration_s`` before the baseline is measured."""
    seed: int = 0
    chat: bool = True
    """Send chat requests too (the server needs a chat template)."""
    constrained: bool = True
    """Send the constrained and over-limit chat kinds too (needs ``chat``; tool_choice=auto
    needs the server's serve.tool_call_parser)."""
    images: bool = False
    """Send the image kinds too (needs ``chat`` and a model that takes images)."""
    media_url: str | None = None
    """A loopback media server answering ``/pic/<n>.png`` with distinct PNGs, allowed by the
    server's serve.allowed_media_domains; None: no http image URLs."""
    rss_slack: float = 0.10
    """Allowed RSS growth after warm-up, as a fraction of the baseline (plus 16 MiB)."""
    request_timeout_s: float = 120.0


@dataclass
class ProcessSample:
    rss_mib: float
    fds: int


@dataclass
class SoakReport:
    seconds: float = 0.0
    requests: Counter = field(default_factory=Counter)
    """By kind."""
    outcomes: Counter = field(default_factory=Counter)
    """By outcome (ok, refused, overloaded, disconnected, unexpected)."""
    unexpected: list[str] = field(default_factory=list)
    """What went wrong, the first few times."""
    baseline: dict[str, ProcessSample] = field(default_factory=dict)
    end: dict[str, ProcessSample] = field(default_factory=dict)
    http_500: float = 0.0
    stats: Counter = field(default_factory=Counter)
    """streams, streams_complete, tool_calls_parsed, cut_short."""
    tracebacks: int = 0
    """Tracebacks in the server's log during the run (set by the caller)."""
    idle: dict[str, float] = field(default_factory=dict)
    """Engine gauges after the traffic: running, waiting, KV usage."""
    rss_slack: float = 0.10

    def problems(self) -> list[str]:
        out = [f"unexpected: {u}" for u in self.unexpected]
        if self.stats["streams"] != self.stats["streams_complete"]:
            out.append(f"{self.stats['streams'] - self.stats['streams_complete']} streams did not complete")
        if self.tracebacks:
            out.append(f"{self.tracebacks} tracebacks in the server's log")
        if self.http_500:
            out.append(f"/metrics counts {self.http_500:.0f} answers with status 500")
        out += [f"not idle at the end: {k}={v}" for k, v in self.idle.items() if v != 0]
        for name, start in self.baseline.items():
            end = self.end.get(name)
            if end is None:
                out.append(f"{name}: gone at the end")
                continue
            if end.rss_mib > start.rss_mib * (1 + self.rss_slack) + 16:
                out.append(f"{name}: RSS grew {start.rss_mib:.0f} -> {end.rss_mib:.0f} MiB after warm-up")
            if end.fds > start.fds + 2:
                out.append(f"{name}: open file descriptors grew {start.fds} -> {end.fds} after warm-up")
        return out

    def to_json(self) -> dict:
        """Plain JSON types (``dataclasses.asdict`` would mangle the Counters)."""
        return {
            "seconds": self.seconds,
            "requests": dict(self.requests),
            "outcomes": dict(self.outcomes),
            "unexpected": self.unexpected,
            "http_500": self.http_500,
            "stats": dict(self.stats),
            "tracebacks": self.tracebacks,
            "idle": self.idle,
            "baseline": {k: vars(v) for k, v in self.baseline.items()},
            "end": {k: vars(v) for k, v in self.end.items()},
            "problems": self.problems(),
        }

    def summary(self) -> str:
        lines = [f"soak: {sum(self.requests.values())} requests in {self.seconds:.0f} s"]
        lines.append("  by kind:    " + ", ".join(f"{k}={v}" for k, v in sorted(self.requests.items())))
        lines.append("  by outcome: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())))
        for name, start in self.baseline.items():
            end = self.end.get(name, ProcessSample(float("nan"), -1))
            lines.append(f"  {name}: RSS {start.rss_mib:.0f} -> {end.rss_mib:.0f} MiB, fds {start.fds} -> {end.fds}")
        lines.append("  checks:     " + ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items())))
        lines.append(f"  http 500s: {self.http_500:.0f}; tracebacks: {self.tracebacks}; at the end: {self.idle}")
        problems = self.problems()
        lines.append("  problems: " + ("; ".join(problems) if problems else "none"))
        return "\n".join(lines)


def sample_process(pid: int) -> ProcessSample:
    """RSS and open descriptors of a live process (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return ProcessSample(rss_kb / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir())))


async def run_soak(base_url: str, cfg: SoakConfig, pids: dict[str, int]) -> SoakReport:
    """Drive the server at ``base_url``; ``pids`` names the processes to watch."""
    report = SoakReport(rss_slack=cfg.rss_slack)
    started = time.monotonic()
    limits = httpx.Limits(max_connections=4 * cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=cfg.request_timeout_s)
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.request_timeout_s, limits=limits) as http:
        card = (await http.get("/v1/models")).json()["data"][0]
        traffic = Traffic(http, card["id"], random.Random(cfg.seed), cfg.max_tokens, cfg.chat, report.stats)
        constrained = ConstrainedTraffic(traffic, client, card["max_model_len"])
        images = ImageTraffic(traffic, cfg.media_url)
        await _drive(traffic, constrained, images, cfg, report, cfg.duration_s * cfg.warmup_frac)
    await _wait_idle(base_url, report)
    report.baseline = {name: sample_process(pid) for name, pid in pids.items()}
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.request_timeout_s, limits=limits) as http:
        traffic.http = http
        await _drive(traffic, constrained, images, cfg, report, cfg.duration_s * (1 - cfg.warmup_frac))
    await client.close()
    report.idle = await _wait_idle(base_url, report)
    report.end = {name: sample_process(pid) for name, pid in pids.items()}
    report.seconds = time.monotonic() - started
    return report


async def _drive(
    traffic: Traffic,
    constrained: ConstrainedTraffic,
    images: ImageTraffic,
    cfg: SoakConfig,
    report: SoakReport,
    seconds: float,
) -> None:
    kinds = traffic.kinds()
    if cfg.chat and cfg.constrained:
        kinds |= constrained.kinds()
    if cfg.chat and cfg.images:
        kinds |= images.kinds()
    names, weights = list(kinds), [w for w, _ in kinds.values()]
    deadline = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < deadline:
            kind = traffic.rng.choices(names, weights)[0]
            report.requests[kind] += 1
            try:
                outcome = await kinds[kind][1]()
            except (Unexpected, httpx.HTTPError, ValueError) as err:
                outcome = "unexpected"
                if len(report.unexpected) < 20:
                    report.unexpected.append(f"{kind}: {type(err).__name__}: {err}")
            report.outcomes[outcome] += 1

    await asyncio.gather(*(client() for _ in range(cfg.concurrency)))


async def _wait_idle(base_url: str, report: SoakReport, timeout: float = 60.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds KV blocks; the last gauges."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        while True:
            samples = _metrics((await http.get("/metrics")).text)
            report.http_500 = samples.get(("http_requests_total", "500"), 0.0)
            idle = {
                "running": samples.get(("num_requests_running", None), -1.0),
                "waiting": samples.get(("num_requests_waiting", None), -1.0),
                "kv_cache_usage": samples.get(("kv_cache_usage_perc", None), -1.0),
            }
            if not any(idle.values()) or time.monotonic() > deadline:
                return idle
            await asyncio.sleep(0.1)


def count_tracebacks(log: str) -> int:
    """Python tracebacks in a server's log text."""
    return log.count("Traceback (most recent call last)")


def _metrics(text: str) -> dict[tuple[str, str | None], float]:
    """{(name, status label or None): value}, summed over other labels; names without
    their prefix (``vllm:`` or whatever ``serve.metrics_prefix`` the server was given)."""
    out: dict[tuple[str, str | None], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name.rpartition(":")[2], s.labels.get("status"))
            out[key] = out.get(key, 0.0) + s.value
    return out


# ---- the plain traffic and its faults -------------------------------------------------------

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


# ---- the constrained and over-limit kinds ----------------------------------------------------

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


# ---- images ------------------------------------------------------------------------------------


@dataclass
class ImageTraffic:
    base: Traffic
    media_url: str | None
    """The loopback media server (``/pic/<n>.png``); None: data URLs only."""
    sent: int = 0
    """Images sent so far: each request's image is a new one."""

    def kinds(self) -> dict[str, tuple[float, Callable[[], Awaitable[str]]]]:
        kinds = {"image_data": (1.5, self.data_url), "image_bomb": (0.2, self.bomb)}
        if self.media_url is not None:
            kinds["image_http"] = (1.5, self.http_url)
            kinds["image_inward"] = (0.3, self.inward)
        return kinds

    async def data_url(self) -> str:
        self.sent += 1
        return await self._ok(_data_url(_png(self.sent)))

    async def http_url(self) -> str:
        self.sent += 1
        return await self._ok(f"{self.media_url}/pic/{self.sent}.png")

    async def inward(self) -> str:
        port = httpx.URL(self.media_url).port
        return await self._refused(f"http://[::1]:{port}/pic/0.png", "could not fetch")

    async def bomb(self) -> str:
        return await self._refused(_data_url(_bomb_png()), "serve.max_image_pixels")

    def _body(self, url: str) -> dict[str, Any]:
        parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
        max_tokens = self.base.rng.randint(1, self.base.max_tokens)
        return {"model": self.base.model, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens}

    async def _ok(self, url: str) -> str:
        res = await self.base.http.post("/v1/chat/completions", json=self._body(url))
        if res.status_code != 200:
            return _status_outcome(res)
        choices = parsed_body(res)["choices"]
        if len(choices) != 1 or choices[0]["finish_reason"] not in ("stop", "length"):
            raise Unexpected(f"image chat: {res.text[:200]}")
        return "ok"

    async def _refused(self, url: str, needle: str) -> str:
        res = await self.base.http.post("/v1/chat/completions", json=self._body(url))
        message = (parsed_body(res).get("error") or {}).get("message", "")
        if res.status_code != 400 or needle not in message:
            raise Unexpected(
                f"image {url[:60]!r}: got {res.status_code}, wanted a 400 with {needle!r}: {message[:200]}"
            )
        return "refused"


def _png(seed: int, size: int = 24) -> bytes:
    from PIL import Image

    pixels = random.Random(seed).randbytes(size * size * 3)
    buf = io.BytesIO()
    Image.frombytes("RGB", (size, size), pixels).save(buf, format="PNG")
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def _bomb_png(side: int = 12000) -> bytes:
    """A valid grey PNG of side x side zero pixels: a few hundred KB."""
    packer = zlib.compressobj(9)
    row = b"\x00" * (side + 1)
    data = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()

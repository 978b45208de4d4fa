"""The disaggregated-prefill proxy (``task=disagg_proxy``): one OpenAI endpoint in front of
prefill and decode servers.

Both kinds are ordinary ``task=serve`` servers whose engines share KV through a connector
(``kv_transfer``: a ``kv_producer`` prefill engine and a ``kv_consumer`` decode engine, on
the same ``shared_storage_path`` or point to point). For each completion or chat request
the proxy::

    client ──> proxy ──(1) same request, max_tokens=1, no stream ──> prefill server  (computes, saves the KV)
                     ──(2) the request as sent ────────────────────> decode server   (loads the KV, answers)
                         + the prefill answer's kv_transfer_params
                     <── the decode server's answer, streamed or whole, as is

As in vLLM, the prefill request carries ``kv_transfer_params: {"do_remote_decode": true}``
and its answer's ``kv_transfer_params`` (where a ``P2pConnector`` producer holds the KV;
absent with shared storage) go to the decode server with the request.

Prefill servers are tried in turn, starting from the next one round-robin: a server that
is down or answers 5xx is skipped for the next; a 4xx (a bad request) goes back to the
client at once. When every prefill server fails the request fails with a 503 naming
them: the proxy never sends a prompt it could not prefill, although the decode side would
compute what it does not find. Decode servers are used round-robin; one that cannot be
reached is a 503 too.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minivllm.config.vllm_config import VllmConfig

PROXIED_ROUTES = ("/v1/completions", "/v1/chat/completions")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request a prefill server gets: the same prompt and options, one token, no stream."""
    body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    body.pop("stream_options", None)
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


class DisaggProxy:
    """Round-robin over the prefill and decode servers, with one shared HTTP client."""

    def __init__(self, prefill: list[str], decode: list[str], timeout_s: float) -> None:
        self.prefill = [url.rstrip("/") for url in prefill]
        self.decode = [url.rstrip("/") for url in decode]
        self._prefill_turn = itertools.cycle(range(len(self.prefill)))
        self._decode_turn = itertools.cycle(range(len(self.decode)))
        self.client = httpx.AsyncClient(timeout=timeout_s)

    async def run_prefill(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Response | None, dict[str, Any] | None]:
        """(None, its kv_transfer_params) once a prefill server computed the prompt; else
        (the response to give the client, None)."""
        start, failures = next(self._prefill_turn), []
        for i in range(len(self.prefill)):
            url = self.prefill[(start + i) % len(self.prefill)]
            try:
                reply = await self.client.post(url + path, json=prefill_body(body), headers=headers)
            except httpx.HTTPError as err:
                failures.append(f"{url}: {type(err).__name__}")
                continue
            if reply.status_code < 400:
                return None, reply.json().get("kv_transfer_params")
            if reply.status_code < 500:  # the request itself is wrong: the decode side would say so too
                return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type")), None
            failures.append(f"{url}: HTTP {reply.status_code}")
        return _unavailable(f"no prefill server could take the request ({'; '.join(failures)})"), None

    async def run_decode(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        url = self.decode[next(self._decode_turn)]
        try:
            reply = await self.client.send(
                self.client.build_request("POST", url + path, json=body, headers=headers), stream=True
            )
        except httpx.HTTPError as err:
            return _unavailable(f"decode server {url}: {type(err).__name__}")
        media_type = reply.headers.get("content-type")
        if body.get("stream"):
            return StreamingResponse(
                reply.aiter_raw(), reply.status_code, media_type=media_type, background=_Close(reply)
            )
        content = await reply.aread()
        await reply.aclose()
        return Response(content, reply.status_code, media_type=media_type)


class _Close:
    """Closes a streamed upstream reply once its bytes are relayed (a response's background task)."""

    def __init__(self, reply: httpx.Response) -> None:
        self.reply = reply

    async def __call__(self) -> None:
        await self.reply.aclose()


def _unavailable(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "ServiceUnavailable", "code": 503}}, 503)


def build_proxy_app(prefill: list[str], decode: list[str], timeout_s: float = 600.0) -> FastAPI:
    """The proxy's FastAPI app over these prefill and decode server base URLs."""
    proxy = DisaggProxy(prefill, decode, timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.client.aclose()

    app = FastAPI(title="minivllm disaggregated-prefill proxy", lifespan=lifespan)
    app.state.proxy = proxy

    async def relay(request: Request) -> Response:
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        failed, params = await proxy.run_prefill(request.url.path, body, headers)
        if failed is not None:
            return failed
        if params is not None:
            body = {**body, "kv_transfer_params": params}
        return await proxy.run_decode(request.url.path, body, headers)

    for route in PROXIED_ROUTES:
        app.post(route)(relay)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        try:
            reply = await proxy.client.get(proxy.decode[0] + "/v1/models", headers=headers)
        except httpx.HTTPError as err:
            return _unavailable(f"decode server {proxy.decode[0]}: {type(err).__name__}")
        return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type"))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    return app


def run_disagg_proxy(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    """``python -m minivllm task=disagg_proxy disagg_proxy.prefill=[URL] disagg_proxy.decode=[URL]``."""
    proxy = cfg.disagg_proxy
    for key in ("prefill", "decode"):
        if not getattr(proxy, key):
            raise ValueError(
                f"task=disagg_proxy: disagg_proxy.{key} is empty; give the {key} servers' base URLs "
                f"(disagg_proxy.{key}=[http://host:port])"
            )
    app = build_proxy_app(list(proxy.prefill), list(proxy.decode), proxy.timeout_s)
    uvicorn.run(app, host=proxy.host, port=proxy.port, log_level="info")
    return {}

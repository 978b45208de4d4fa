"""Fetching a media URL that a client names, without letting the client aim the server inward.

The rules, checked on every hop (the first URL and each redirect):

- only ``http`` and ``https``;
- with ``allowed_domains`` empty, any host whose every resolved address is public; a host
  with one loopback, private, link-local, unique-local, multicast, unspecified or reserved
  address is refused (an IPv4 address inside IPv6, mapped, 6to4 or NAT64, is judged as the
  IPv4 address). With ``allowed_domains`` set, only the hosts named there (exactly, as
  names or address literals), at whatever address they resolve to: that is how an operator
  allows an inward media server, loopback test servers included, and never by address range;
- the connection goes to the address that was checked (the URL's host is replaced by it,
  ``Host`` and, for https, the TLS server name keep the name), so a second DNS answer
  cannot swap in another address; proxies from the environment are ignored;
- at most ``max_redirects`` redirects; one deadline for the whole fetch (waiting for a
  slot, resolving, connecting, headers, body, every hop); at most ``max_bytes`` of body;
  at most ``max_concurrent`` fetches at once per event loop (a server has one loop).

Every refusal and failure is one ValueError worded ``<field>: could not fetch <url>: <rule>``.
Upstream statuses, reasons and connection errors are never repeated: told apart, they would
make the server a port scanner.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Awaitable, Callable

import httpx

MAX_MEDIA_BYTES = 20 * 1024 * 1024
"""Largest encoded media body read from a URL."""

FETCH_DEADLINE_S = 10.0
"""Default deadline of one whole fetch, redirects included."""

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_URL_SHOWN = 200

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> the host's addresses, as strings."""

NOT_PUBLIC = (
    "its address is loopback, private, link-local, unique-local, multicast or reserved; "
    "name the host in serve.allowed_media_domains to allow it"
)
NOT_ALLOWED = "the host is not in serve.allowed_media_domains"
NO_IMAGE = "no media came back"
FETCH_OFF = "fetching media URLs is turned off (serve.fetch_media_urls)"
SHUTTING_DOWN = "the server is shutting down"


def is_public(address: str) -> bool:
    """True when ``address`` (an IP literal) is a public unicast address."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(str(embedded))
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def _normal_host(host: str) -> str:
    return host.strip().rstrip(".").lower().removeprefix("[").removesuffix("]")


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives for ``host`` (an IP literal answers itself)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]).split("%", 1)[0] for info in infos]


@dataclass(frozen=True)
class FetchRules:
    """What a media fetch may do (``serve.*`` keys in the server's config)."""

    enabled: bool = True
    """False: no URL is fetched (``serve.fetch_media_urls``)."""
    allowed_domains: tuple[str, ...] = ()
    """Empty: any public host. Set: only these hosts, at any address (``serve.allowed_media_domains``)."""
    deadline_s: float = FETCH_DEADLINE_S
    """One fetch, every hop, connect to last byte (``serve.media_fetch_timeout_s``)."""
    max_bytes: int = MAX_MEDIA_BYTES
    """Largest body read."""
    max_redirects: int = 3
    """Redirects followed, each re-checked."""
    max_concurrent: int = 8
    """Fetches at once per event loop (``serve.max_concurrent_media_fetches``)."""


class FetchError(ValueError):
    """A refused or failed fetch, in the one wording."""

    def __init__(self, field: str, url: str, rule: str) -> None:
        shown = url if len(url) <= _URL_SHOWN else url[:_URL_SHOWN] + "..."
        super().__init__(f"{field}: could not fetch {shown}: {rule}")


@dataclass(frozen=True)
class _Hop:
    """One checked request: the URL as named, and the address it will connect to."""

    url: httpx.URL
    address: str

    def request(self) -> httpx.Request:
        host = self.url.host
        pinned = self.url.copy_with(host=self.address)
        extensions = {"sni_hostname": host} if self.url.scheme == "https" else {}
        netloc = self.url.netloc.decode("ascii")
        return httpx.Request(
            "GET",
            pinned,
            headers={"Host": netloc, "Accept": "*/*", "Accept-Encoding": "identity"},
            extensions=extensions,
        )


class MediaFetcher:
    """Fetches media URLs under :class:`FetchRules`; async, with a blocking twin for offline use."""

    def __init__(self, rules: FetchRules | None = None, resolver: Resolver | None = None) -> None:
        self.rules = rules or FetchRules()
        self._resolve = resolver or system_resolver
        self._allowed = frozenset(_normal_host(h) for h in self.rules.allowed_domains)
        self._ssl: ssl.SSLContext | None = None
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._lock = threading.Lock()
        self._inflight: set[asyncio.Task] = set()
        self._closed = False

    async def fetch(self, url: str, field: str = "image_url") -> bytes:
        """The body at ``url``; FetchError (a ValueError) when refused, failed, late, or cut by
        :meth:`close`."""
        if not self.rules.enabled:
            raise FetchError(field, url, FETCH_OFF)
        if self._closed:
            raise FetchError(field, url, SHUTTING_DOWN)
        deadline = self.rules.deadline_s
        task = asyncio.ensure_future(asyncio.wait_for(self._gated(url, field), deadline))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        try:
            return await task
        except asyncio.TimeoutError:
            raise FetchError(
                field, url, f"no complete answer within the {deadline:g} s deadline (serve.media_fetch_timeout_s)"
            ) from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            cancelling = getattr(current, "cancelling", lambda: 0)()
            if self._closed and task.cancelled() and not cancelling:
                raise FetchError(field, url, SHUTTING_DOWN) from None
            raise

    def close(self) -> None:
        """Cut every fetch in flight (each ends in a FetchError at once) and refuse new ones:
        a server's shutdown never waits on a media server. Call it on the fetches' loop."""
        self._closed = True
        for task in list(self._inflight):
            task.cancel()

    def fetch_blocking(self, url: str, field: str = "image_url") -> bytes:
        """:meth:`fetch` for callers without an event loop (``LLM.chat``); never call it on a
        server's loop or tokenizer thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.fetch(url, field))
        box: list[bytes | BaseException] = []

        def run() -> None:
            try:
                box.append(asyncio.run(self.fetch(url, field)))
            except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
                box.append(err)

        worker = threading.Thread(target=run, name="media-fetch", daemon=True)
        worker.start()
        worker.join()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    async def _gated(self, url: str, field: str) -> bytes:
        async with self._gate():
            return await self._follow(url, field)

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [other for other in self._gates if other.is_closed()]:
                del self._gates[old]
            gate = self._gates.get(loop)
            if gate is None:
                gate = self._gates[loop] = asyncio.Semaphore(self.rules.max_concurrent)
            return gate

    async def _follow(self, url: str, field: str) -> bytes:
        async with httpx.AsyncClient(
            verify=self._ssl_context(), trust_env=False, follow_redirects=False, timeout=None
        ) as client:
            current = url
            for _ in range(self.rules.max_redirects + 1):
                hop = await self._check(current, url, field)
                body, location = await self._get(client, hop, url, field)
                if location is None:
                    return body
                current = urllib.parse.urljoin(current, location)
        raise FetchError(field, url, f"more than {self.rules.max_redirects} redirects")

    async def _check(self, current: str, url: str, field: str) -> _Hop:
        """``current`` (``url`` or a redirect from it) under the rules, with its checked address."""
        try:
            parsed = httpx.URL(current)
        except (httpx.InvalidURL, ValueError, TypeError):
            raise FetchError(field, url, "not a valid URL") from None
        if parsed.scheme not in ("http", "https"):
            raise FetchError(field, url, "only http and https URLs are fetched")
        host = _normal_host(parsed.host)
        if not host:
            raise FetchError(field, url, "the URL names no host")
        named = host in self._allowed
        if self._allowed and not named:
            raise FetchError(field, url, NOT_ALLOWED)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            addresses = await self._resolve(host, port)
        except (OSError, UnicodeError):
            raise FetchError(field, url, NO_IMAGE) from None
        if not addresses:
            raise FetchError(field, url, NO_IMAGE)
        try:
            public = [is_public(a) for a in addresses]
        except ValueError:
            raise FetchError(field, url, NO_IMAGE) from None
        if not named and not all(public):
            raise FetchError(field, url, NOT_PUBLIC)
        return _Hop(parsed, addresses[0])

    async def _get(self, client: httpx.AsyncClient, hop: _Hop, url: str, field: str) -> tuple[bytes, str | None]:
        """(body, None) for a 200; (b"", location) for a redirect; FetchError otherwise."""
        cap = self.rules.max_bytes
        try:
            response = await client.send(hop.request(), stream=True)
            try:
                if response.status_code in _REDIRECTS and response.headers.get("location"):
                    return b"", response.headers["location"]
                if response.status_code != 200:
                    raise FetchError(field, url, NO_IMAGE)
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise FetchError(field, url, f"larger than {cap} bytes")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > cap:
                        raise FetchError(field, url, f"larger than {cap} bytes")
                    chunks.append(chunk)
                return b"".join(chunks), None
            finally:
                await response.aclose()
        except httpx.HTTPError:
            raise FetchError(field, url, NO_IMAGE) from None

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

"""Media fetching that cannot be aimed inward (issue: SSRF through image_url).

Every server here is on loopback; no test sends a packet elsewhere: a guard fails any
connection to another address, and private, link-local and other ranges are reached only
through address literals or a resolver of the test's own, refused before any connection."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from minivllm.multimodal import fetch as fetch_module
from minivllm.multimodal.fetch import FetchRules, MediaFetcher, _Hop, is_public
from minivllm.multimodal.media import MediaConnector, decode_image
from tests.multimodal.media_server import MediaServer, bomb_png, png_bytes

LOOPBACK = ("127.0.0.1", "::1")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Fail any request that would leave the machine."""
    send = httpx.AsyncClient.send

    async def guarded(self, request, **kwargs):
        assert request.url.host in LOOPBACK, f"a test tried to reach {request.url.host}"
        return await send(self, request, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", guarded)


@pytest.fixture(scope="module")
def media():
    with MediaServer() as server:
        yield server


def fake_resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise OSError("no such name")
        return table[host]

    return resolve


def fetch(url: str, *, resolver=None, **rules) -> bytes:
    return MediaFetcher(FetchRules(**rules), resolver).fetch_blocking(url)


def refused(url: str, rule: str, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        fetch(url, **kwargs)
    message = str(err.value)
    assert message.startswith(f"image_url: could not fetch {url}: "), message
    assert rule in message, message
    return message


@pytest.mark.parametrize(
    "address,public",
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("239.255.255.250", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("fc00::1", False),
        ("ff02::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("64:ff9b::7f00:1", False),
        ("2002:7f00:1::", False),
        ("::ffff:93.184.216.34", True),
    ],
)
def test_address_ranges(address, public):
    assert is_public(address) is public


def test_loopback_is_refused_by_default_and_nothing_is_sent(media):
    before = media.hits
    refused(f"{media.base}/pic.png", "loopback, private")
    refused(f"http://localhost:{media.port}/pic.png", "loopback, private")
    refused(f"http://[::1]:{media.port}/pic.png", "loopback, private")
    assert media.hits == before


@pytest.mark.parametrize(
    "host",
    ["10.0.0.1", "192.168.0.10", "172.20.1.1", "169.254.169.254", "[fe80::1]", "[fd12::1]", "224.0.0.1", "0.0.0.0"],
)
def test_private_and_link_local_literals_are_refused(host):
    refused(f"http://{host}/latest/meta-data/", "loopback, private")


def test_every_address_of_a_name_is_checked():
    resolver = fake_resolver({"mixed.example": ["93.184.216.34", "10.0.0.5"], "inner.example": ["fd00::5"]})
    refused("http://mixed.example/x.png", "loopback, private", resolver=resolver)
    refused("https://inner.example/x.png", "loopback, private", resolver=resolver)


def test_a_host_is_allowed_by_name_and_only_those_named(media):
    assert fetch(f"{media.base}/pic.png", allowed_domains=("127.0.0.1",)) == png_bytes(0)
    refused(
        f"http://localhost:{media.port}/pic.png", "not in serve.allowed_media_domains", allowed_domains=("127.0.0.1",)
    )
    refused("http://93.184.216.34/pic.png", "not in serve.allowed_media_domains", allowed_domains=("127.0.0.1",))


def test_the_connection_goes_to_the_checked_address(media):
    """A name the system cannot resolve is fetched through the one answer that was checked,
    with its own name in Host; the resolver is asked once (a second answer cannot swap it)."""
    calls: list[str] = []
    resolver = fake_resolver({"media.test": ["127.0.0.1"]}, calls)
    body = fetch(f"http://media.test:{media.port}/pic.png", resolver=resolver, allowed_domains=("MEDIA.test.",))
    assert body == png_bytes(0)
    assert calls == ["media.test"] and media.hosts[-1] == f"media.test:{media.port}"


def test_https_keeps_the_name_for_tls():
    hop = _Hop(httpx.URL("https://media.example:8443/a.png?x=1"), "93.184.216.34")
    request = hop.request()
    assert request.url.host == "93.184.216.34" and request.url.port == 8443 and request.url.path == "/a.png"
    assert request.headers["Host"] == "media.example:8443"
    assert request.extensions["sni_hostname"] == "media.example"
    assert "sni_hostname" not in _Hop(httpx.URL("http://media.example/a.png"), "93.184.216.34").request().extensions


@pytest.fixture
def loopback_counts_as_public(monkeypatch):
    """The loopback server plays a public one: redirects from it are judged by the default rules."""
    real = fetch_module.is_public
    monkeypatch.setattr(fetch_module, "is_public", lambda a: a == "127.0.0.1" or real(a))


@pytest.mark.parametrize(
    "target,rule",
    [
        ("http://169.254.169.254/latest/meta-data/", "loopback, private"),
        ("http://10.0.0.1:8080/admin", "loopback, private"),
        ("http://[::1]:{port}/pic.png", "loopback, private"),
        ("ftp://127.0.0.1/pic.png", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
    ],
)
def test_redirects_are_checked_hop_by_hop(media, loopback_counts_as_public, target, rule):
    url = f"{media.base}/redirect?to={target.format(port=media.port)}"
    assert fetch(f"{media.base}/redirect?to=/pic.png") == png_bytes(0)
    refused(url, rule)


def test_a_redirect_to_an_unnamed_host_is_refused(media):
    url = f"{media.base}/redirect?to=http://localhost:{media.port}/pic.png"
    refused(url, "not in serve.allowed_media_domains", allowed_domains=("127.0.0.1",))


def test_redirects_are_few(media):
    refused(f"{media.base}/loop", "more than 3 redirects", allowed_domains=("127.0.0.1",))


def test_one_wording_for_every_failure(media):
    """A 404, a 500 with its own reason and a closed port read the same: no port scanner."""
    allowed = {"allowed_domains": ("127.0.0.1",)}
    messages = [
        refused(f"{media.base}/status/404", "no media came back", **allowed),
        refused(f"{media.base}/status/500", "no media came back", **allowed),
        refused("http://127.0.0.1:9/x", "no media came back", **allowed),
        refused("http://no-such-host.invalid/x", "no media came back", resolver=fake_resolver({})),
    ]
    for message in messages:
        for leak in ("404", "500", "Secret-Reason", "refused", "Errno", "Connect", "no such name"):
            assert leak not in message.split(": ", 2)[-1]


def test_one_deadline_for_the_whole_fetch(media):
    """A server that drips a byte every 0.2 s never trips a per-read timeout; the deadline holds."""
    start = time.monotonic()
    refused(
        f"{media.base}/drip",
        "within the 1 s deadline (serve.media_fetch_timeout_s)",
        allowed_domains=("127.0.0.1",),
        deadline_s=1.0,
    )
    assert time.monotonic() - start < 2.0


def test_size_cap(media):
    refused(f"{media.base}/big", "larger than 1000 bytes", allowed_domains=("127.0.0.1",), max_bytes=1000)
    assert len(fetch(f"{media.base}/big", allowed_domains=("127.0.0.1",))) == 1_000_000


def test_fetching_can_be_turned_off(media):
    before = media.hits
    refused(
        f"{media.base}/pic.png", "turned off (serve.fetch_media_urls)", allowed_domains=("127.0.0.1",), enabled=False
    )
    assert media.hits == before


def test_concurrent_fetches_are_capped(media):
    fetcher = MediaFetcher(FetchRules(allowed_domains=("127.0.0.1",), max_concurrent=2))
    media.most_active = 0

    async def many():
        return await asyncio.gather(*(fetcher.fetch(f"{media.base}/slow") for _ in range(5)))

    assert asyncio.run(many()) == [png_bytes(0)] * 5
    assert media.most_active == 2


def test_fetch_ahead_fills_the_connector_and_nothing_is_fetched_later(media):
    rules = FetchRules(allowed_domains=("127.0.0.1",))
    connector = MediaConnector(fetcher=MediaFetcher(rules))
    urls = [(f"{media.base}/pic.png", "a"), ("data:image/png;base64,AAAA", "b")]
    ahead = asyncio.run(connector.fetch_ahead(urls))
    assert set(ahead.fetched) == {f"{media.base}/pic.png"}
    before = media.hits
    assert ahead.load_image(f"{media.base}/pic.png").size == (24, 24)
    with pytest.raises(ValueError, match="not fetched ahead"):
        ahead.load_image(f"{media.base}/pic/3.png")
    assert media.hits == before
    with pytest.raises(ValueError, match=r"could not fetch .*/status/404: no media came back"):
        asyncio.run(connector.fetch_ahead([(f"{media.base}/pic.png", "a"), (f"{media.base}/status/404", "b")]))


def test_blocking_fetch_inside_a_running_loop(media):
    fetcher = MediaFetcher(FetchRules(allowed_domains=("127.0.0.1",)))

    async def inside():
        return fetcher.fetch_blocking(f"{media.base}/pic.png")

    assert asyncio.run(inside()) == png_bytes(0)


def test_a_decompression_bomb_is_refused_from_its_header():
    """12000 x 12000 (144 MP, a few hundred KB of PNG, under Pillow's own limit) is refused
    before a pixel is decoded: well under a second."""
    bomb = bomb_png(12000, 12000)
    assert len(bomb) < 1_000_000
    start = time.monotonic()
    with pytest.raises(
        ValueError, match=r"12000x12000 = 144000000 pixels, over the cap of 40000000 \(serve.max_image_pixels\)"
    ):
        decode_image(bomb, "image_url")
    assert time.monotonic() - start < 0.5
    with pytest.raises(ValueError, match="over the cap of 100"):
        MediaConnector(max_image_pixels=100).load_image(
            "data:image/png;base64," + __import__("base64").b64encode(png_bytes()).decode()
        )


def test_file_urls_with_a_host_are_refused(tmp_path):
    (tmp_path / "pic.png").write_bytes(png_bytes())
    connector = MediaConnector(allowed_local_media_path=str(tmp_path))
    assert connector.load_image(f"file://{tmp_path}/pic.png").size == (24, 24)
    assert connector.load_image(f"file://localhost{tmp_path}/pic.png").size == (24, 24)
    with pytest.raises(ValueError, match="names no host but localhost"):
        connector.load_image(f"file://fileserver{tmp_path}/pic.png")


def test_confinement_errors_do_not_echo_the_root_or_link_targets(tmp_path):
    root = tmp_path / "secret-root"
    root.mkdir()
    outside = tmp_path / "hidden-target"
    outside.mkdir()
    (outside / "pic.png").write_bytes(png_bytes())
    (root / "link.png").symlink_to(outside / "pic.png")
    connector = MediaConnector(allowed_local_media_path=str(root))
    for url in (f"file://{root}/link.png", f"file://{root}/../hidden-target/pic.png", f"file://{root}/missing.png"):
        with pytest.raises(ValueError) as err:
            connector.load_image(url)
        message = str(err.value).replace(url[len("file://") :], "<named>")
        assert "secret-root" not in message and "hidden-target" not in message, message


def test_close_cuts_fetches_in_flight(media):
    fetcher = MediaFetcher(FetchRules(allowed_domains=("127.0.0.1",), deadline_s=30.0))

    async def cut():
        pending = asyncio.ensure_future(fetcher.fetch(f"{media.base}/drip"))
        await asyncio.sleep(0.5)
        start = time.monotonic()
        fetcher.close()
        with pytest.raises(ValueError, match="could not fetch .*: the server is shutting down"):
            await pending
        assert time.monotonic() - start < 0.5
        with pytest.raises(ValueError, match="the server is shutting down"):
            await fetcher.fetch(f"{media.base}/pic.png")

    asyncio.run(cut())

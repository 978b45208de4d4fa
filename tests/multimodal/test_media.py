"""Image URLs over http from a local server: fetched and decoded like the same file
from disk; a body over the size cap and a missing path are clear errors."""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minivllm.multimodal.fetch import FetchRules, MediaFetcher
from minivllm.multimodal.media import MediaConnector
from tests.multimodal.llava_checkpoint import random_image


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _loopback(**rules) -> MediaConnector:
    """A connector that may fetch from the loopback test server (allowed by name)."""
    return MediaConnector(fetcher=MediaFetcher(FetchRules(allowed_domains=("127.0.0.1",), deadline_s=5, **rules)))


@pytest.fixture(scope="module")
def http_root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http")
    random_image(60, size=40).save(folder / "pic.png")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    thread.join(5)


def test_http_image_equals_the_file(http_root):
    base, folder = http_root
    fetched = _loopback().load_image(f"{base}/pic.png")
    local = MediaConnector(allowed_local_media_path=str(folder)).load_image(f"file://{folder / 'pic.png'}")
    assert fetched.size == (40, 40) and fetched.tobytes() == local.tobytes()


def test_http_size_cap_and_missing_file(http_root):
    base, folder = http_root
    with pytest.raises(ValueError, match="larger than 100 bytes"):
        _loopback(max_bytes=100).load_image(f"{base}/pic.png")
    with pytest.raises(ValueError, match="could not fetch"):
        _loopback().load_image(f"{base}/missing.png")

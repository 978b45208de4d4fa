"""A loopback media server for fetch tests: images, redirects, slow drips, statuses; it
counts the requests it saw and the most it served at once."""

from __future__ import annotations

import io
import struct
import threading
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.multimodal.llava_checkpoint import random_image


def png_bytes(seed: int = 0, size: int = 24) -> bytes:
    buf = io.BytesIO()
    random_image(seed, size).save(buf, format="PNG")
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A valid grey PNG of ``width`` x ``height`` zero pixels: a few hundred KB on the wire."""
    row = b"\x00" * (width + 1)
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


class MediaServer:
    """``/pic.png``, ``/pic/<seed>.png`` (distinct images), ``/redirect?to=<url>``,
    ``/loop`` (redirects to itself), ``/drip`` (one byte every 0.2 s, for a minute),
    ``/slow`` (an image after 0.5 s), ``/status/<code>``, ``/big`` (1 MB)."""

    def __init__(self) -> None:
        self.hits = 0
        self.hosts: list[str] = []
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with owner._lock:
                    owner.hits += 1
                    owner.hosts.append(self.headers.get("Host", ""))
                try:
                    owner._serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        if url.path == "/redirect":
            return self._redirect(h, urllib.parse.parse_qs(url.query)["to"][0])
        if url.path == "/loop":
            return self._redirect(h, "/loop")
        if url.path.startswith("/status/"):
            h.send_response(int(url.path.rsplit("/", 1)[1]), "Secret-Reason")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        if url.path == "/drip":
            h.send_response(200)
            h.send_header("Content-Length", "300")
            h.end_headers()
            for _ in range(300):
                if self._stop.wait(0.2):
                    return None
                h.wfile.write(b"x")
                h.wfile.flush()
            return None
        if url.path == "/slow":
            with self._lock:
                self.active += 1
                self.most_active = max(self.most_active, self.active)
            self._stop.wait(0.5)
            with self._lock:
                self.active -= 1
            return self._body(h, png_bytes(0))
        if url.path == "/big":
            return self._body(h, b"\x00" * 1_000_000)
        if url.path == "/pic.png":
            return self._body(h, png_bytes(0))
        if url.path.startswith("/pic/"):
            return self._body(h, png_bytes(int(url.path[5:].split(".")[0]) % 100_000, size=16))
        h.send_response(404)
        h.send_header("Content-Length", "0")
        h.end_headers()
        return None

    @staticmethod
    def _redirect(h: BaseHTTPRequestHandler, to: str) -> None:
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()

    @staticmethod
    def _body(h: BaseHTTPRequestHandler, body: bytes) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "image/png")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

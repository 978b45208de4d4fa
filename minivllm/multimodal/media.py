"""Images from where a request names them: PIL images, ``data:`` URLs, local files
(only under ``model.allowed_local_media_path``) and http(s) URLs (under the rules of
:mod:`minivllm.multimodal.fetch`). Every failure is a ValueError naming the field; the
engine is untouched.

An image's size is read from its header before any pixel is decoded: more than
``max_image_pixels`` is refused at the cost of reading a header, whatever the file's size.
Local-file errors name the URL as given, never the allowed folder or where a link leads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import io
import urllib.parse
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from PIL import Image

from minivllm.multimodal.fetch import FetchRules, MediaFetcher

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

MAX_IMAGE_PIXELS = 40_000_000
"""Default pixel cap (width * height): an 8K frame (33.2 MP) passes, a 12000x12000 bomb does not."""


def decode_image(raw: bytes, field: str, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Encoded bytes (PNG, JPEG, ...) -> a decoded PIL image; ValueError when they are not one,
    or when the header declares more than ``max_pixels`` pixels (checked before decoding)."""
    try:
        with warnings.catch_warnings():  # the cap below is ours; Pillow's warning would repeat it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))  # reads the header only
    except Image.DecompressionBombError:
        raise ValueError(
            f"{field}: the image is over the cap of {max_pixels} pixels (serve.max_image_pixels)"
        ) from None
    except Exception as err:  # noqa: BLE001 - PIL raises several kinds for bad bytes
        raise ValueError(f"{field}: could not decode the image ({type(err).__name__}: {err})") from None
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise ValueError(
            f"{field}: the image is {width}x{height} = {width * height} pixels, "
            f"over the cap of {max_pixels} (serve.max_image_pixels)"
        )
    try:
        image.load()  # decode now: a truncated file fails here, not in the processor
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{field}: could not decode the image ({type(err).__name__}: {err})") from None
    return image


def is_remote(url: Any) -> bool:
    """True for an http(s) URL (one that :class:`MediaFetcher` fetches)."""
    return isinstance(url, str) and urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


@dataclass(frozen=True)
class MediaConnector:
    """Loads an ``image_url`` under the engine's media rules.

    ``fetched`` holds the bodies of http(s) URLs fetched ahead (on a server's event loop,
    see :meth:`fetch_ahead`); when it is set, nothing is fetched here, so the thread that
    renders a prompt never waits on the network. When it is None, http(s) URLs are fetched
    here, blocking (``LLM.chat``)."""

    allowed_local_media_path: str = ""
    fetcher: MediaFetcher = field(default_factory=MediaFetcher)
    max_image_pixels: int = MAX_IMAGE_PIXELS
    fetched: Mapping[str, bytes] | None = None

    @classmethod
    def for_config(cls, cfg: VllmConfig) -> MediaConnector:
        """The connector of ``cfg``'s rules (``model.allowed_local_media_path`` and the ``serve.*``
        media keys): a server builds one and keeps it (its fetcher caps fetches per server)."""
        serve = cfg.serve
        rules = FetchRules(
            enabled=serve.fetch_media_urls,
            allowed_domains=tuple(serve.allowed_media_domains),
            deadline_s=serve.media_fetch_timeout_s,
            max_concurrent=serve.max_concurrent_media_fetches,
        )
        return cls(cfg.model.allowed_local_media_path, MediaFetcher(rules), serve.max_image_pixels)

    def load_image(self, url: str, field: str = "image_url") -> Image.Image:
        if not isinstance(url, str) or not url:
            raise ValueError(f"{field}: must be a non-empty URL string (data:, file: or http(s):)")
        scheme = urllib.parse.urlparse(url).scheme.lower()
        if scheme == "data":
            raw = self._data_url(url, field)
        elif scheme == "file":
            raw = self._local_file(url, field)
        elif scheme in ("http", "https"):
            raw = self._remote(url, field)
        else:
            raise ValueError(f"{field}: URL scheme {scheme!r} not supported; use data:, file: or http(s):")
        return decode_image(raw, field, self.max_image_pixels)

    async def fetch_ahead(self, urls: Iterable[tuple[str, str]]) -> MediaConnector:
        """This connector with the bodies of the http(s) ones among ``urls`` ((url, field)
        pairs) fetched, concurrently, on the running loop; the first failure is raised."""
        wanted = {url: name for url, name in urls if is_remote(url)}
        tasks = [asyncio.ensure_future(self.fetcher.fetch(url, name)) for url, name in wanted.items()]
        try:
            bodies = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # the first failure (or the caller's cancellation) ends the rest
        return dataclasses.replace(self, fetched=dict(zip(wanted, bodies)))

    def _remote(self, url: str, field: str) -> bytes:
        if self.fetched is None:
            return self.fetcher.fetch_blocking(url, field)
        if url not in self.fetched:
            raise ValueError(f"{field}: could not fetch {url}: it was not fetched ahead")
        return self.fetched[url]

    @staticmethod
    def _data_url(url: str, field: str) -> bytes:
        header, sep, payload = url[len("data:") :].partition(",")
        if not sep or not header.endswith(";base64"):
            raise ValueError(f"{field}: a data URL must look like data:image/png;base64,<base64 bytes>")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{field}: the data URL's payload is not valid base64") from None

    def _local_file(self, url: str, field: str) -> bytes:
        parsed = urllib.parse.urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{field}: a file URL names no host but localhost (file:///path)")
        if not self.allowed_local_media_path:
            raise ValueError(
                f"{field}: local files are refused; set model.allowed_local_media_path to a folder to allow them"
            )
        root = Path(self.allowed_local_media_path).resolve()
        named = urllib.parse.unquote(parsed.path)
        path = Path(named).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"{field}: {named} is outside model.allowed_local_media_path")
        if not path.is_file():
            raise ValueError(f"{field}: no such file {named}")
        cap = self.fetcher.rules.max_bytes
        if path.stat().st_size > cap:
            raise ValueError(f"{field}: {named} is larger than {cap} bytes")
        return path.read_bytes()

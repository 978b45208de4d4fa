"""Images from where a request names them: PIL images, ``data:`` URLs, local files
(only under ``model.allowed_local_media_path``) and http(s) URLs (with a timeout and
a size cap). Every failure is a ValueError naming the field; the engine is untouched.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""Largest encoded image read from a URL."""
FETCH_TIMEOUT_S = 10.0


def decode_image(raw: bytes, field: str) -> Image.Image:
    """Encoded bytes (PNG, JPEG, ...) -> a decoded PIL image; ValueError when they are not one."""
    try:
        image = Image.open(io.BytesIO(raw))
        image.load()  # decode now: a truncated file fails here, not in the processor
    except Exception as err:  # noqa: BLE001 - PIL raises several kinds for bad bytes
        raise ValueError(f"{field}: could not decode the image ({type(err).__name__}: {err})") from None
    return image


@dataclass(frozen=True)
class MediaConnector:
    """Loads an ``image_url`` under the engine's media rules."""

    allowed_local_media_path: str = ""
    timeout_s: float = FETCH_TIMEOUT_S
    max_bytes: int = MAX_IMAGE_BYTES

    def load_image(self, url: str, field: str = "image_url") -> Image.Image:
        if not isinstance(url, str) or not url:
            raise ValueError(f"{field}: must be a non-empty URL string (data:, file: or http(s):)")
        scheme = urllib.parse.urlparse(url).scheme
        if scheme == "data":
            return decode_image(self._data_url(url, field), field)
        if scheme == "file":
            return decode_image(self._local_file(url, field), field)
        if scheme in ("http", "https"):
            return decode_image(self._fetch(url, field), field)
        raise ValueError(f"{field}: URL scheme {scheme!r} not supported; use data:, file: or http(s):")

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
        if not self.allowed_local_media_path:
            raise ValueError(
                f"{field}: local files are refused; set model.allowed_local_media_path to a folder to allow them"
            )
        root = Path(self.allowed_local_media_path).resolve()
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"{field}: {path} is outside model.allowed_local_media_path ({root})")
        if not path.is_file():
            raise ValueError(f"{field}: no such file {path}")
        if path.stat().st_size > self.max_bytes:
            raise ValueError(f"{field}: {path} is larger than {self.max_bytes} bytes")
        return path.read_bytes()

    def _fetch(self, url: str, field: str) -> bytes:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:  # noqa: S310 - scheme checked
                raw = response.read(self.max_bytes + 1)
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ValueError(f"{field}: could not fetch {url} ({err})") from None
        if len(raw) > self.max_bytes:
            raise ValueError(f"{field}: {url} is larger than {self.max_bytes} bytes")
        return raw

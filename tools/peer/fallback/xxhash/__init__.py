"""A stand-in for ``xxhash`` (nano-vllm hashes its KV blocks with ``xxh64``), on the path only
after the real package: 64-bit BLAKE2b. The hashes differ from xxHash's, which only matters
across processes; nano-vllm compares them within one."""

from __future__ import annotations

import hashlib


class xxh64:  # noqa: N801 (xxhash's name)
    def __init__(self, data: bytes = b"") -> None:
        self._h = hashlib.blake2b(data, digest_size=8)

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def intdigest(self) -> int:
        return int.from_bytes(self._h.digest(), "little")

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> bytes:
        return self._h.digest()

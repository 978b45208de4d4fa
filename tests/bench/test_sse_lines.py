"""The soak client's SSE line splitter: lines end at LF, CR or CRLF only, so generated text
with U+0085 or U+2028 (JSON leaves them unescaped) stays inside its event, whatever the chunking."""

from __future__ import annotations

import asyncio
import json

from minivllm.bench.soak import sse_lines


class _Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def aiter_bytes(self):
        for chunk in self.chunks:
            yield chunk


def _lines(chunks: list[bytes]) -> list[str]:
    async def collect():
        return [line async for line in sse_lines(_Chunks(chunks))]

    return asyncio.run(collect())


def test_lines_split_only_at_sse_line_ends_across_any_chunking():
    events = [{"text": "a\u2028b\u0085c\x1cé"}, {"text": "✓"}]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events).encode()
    body += b"data: [DONE]\r\n\r\n"
    expected = [f"data: {json.dumps(e, ensure_ascii=False)}" for e in events]
    for size in (1, 2, 3, 7, len(body)):  # chunk edges inside characters and inside CRLF
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        lines = [line for line in _lines(chunks) if line]
        assert lines == [*expected, "data: [DONE]"], size
        assert [json.loads(line[len("data: ") :]) for line in lines[:2]] == events

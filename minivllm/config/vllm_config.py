"""The root of the config tree and the values derived from it.

``VllmConfig`` is what every component receives. Its fields are the Hydra
groups; derived values (the checkpoint's ``hf_config``, the resolved device,
dtype and ``max_model_len``) are computed in ``__post_init__`` so that a bad
config fails when it is built, before any work starts.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from minivllm.config.bench import BenchConfig
from minivllm.config.model_source import load_hf_config
from minivllm.core.sliding_window import max_blocks_per_request, model_sliding_window
from minivllm.distributed.utils import check_expert_parallel, check_tensor_parallel
from minivllm.layers.rotary import check_rope_types
from minivllm.quantization import QuantizationConfig, get_quantization_config
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.config.schema import (
    AttentionConfig,
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    TaskConfig,
)
from minivllm.config.validation import check_range
from minivllm.models.registry import ModelRegistry

ATTENTION_TARGETS = {
    "torch": "minivllm.attention.torch_backend.TorchAttentionBackend",
    "triton": "minivllm.attention.triton_backend.TritonAttentionBackend",
}
EXECUTOR_TARGETS = {
    "uni": "minivllm.executor.uniproc.UniProcExecutor",
    "mp": "minivllm.executor.multiproc.MultiprocExecutor",
    "ray": "minivllm.executor.ray_executor.RayDistributedExecutor",
}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


TOOL_CALL_PARSERS = ("hermes", "llama3_json")
REASONING_PARSERS = ("deepseek_r1", "qwen3")


@dataclass
class ServeConfig:
    """The HTTP server of task=serve."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    port: int = 8000
    """Port the HTTP server binds."""
    api_key: Optional[str] = None
    """When set, every /v1 route needs ``Authorization: Bearer <api_key>``."""
    served_model_name: Optional[str] = None
    """Model name reported by /v1/models; defaults to model.path."""
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

    def __post_init__(self) -> None:
        check_range("serve.port", self.port, low=0, high=65535)
        check_range("serve.shutdown_timeout", self.shutdown_timeout, low=0.0)
        check_range("serve.max_n", self.max_n, low=1)
        check_range("serve.max_seqs_per_request", self.max_seqs_per_request, low=1)
        check_range("serve.max_waiting", self.max_waiting, low=0)
        for key, allowed in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise ValueError(f"serve.{key}={value!r}: must be one of {', '.join(allowed)} (or null)")


@dataclass
class VllmConfig:
    """The root of the tree: one field per config group, plus the run keys."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Which checkpoint, dtype and context length."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor parallelism and the executor/worker/runner classes."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """Paged KV cache: block size, memory share, prefix caching."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Token budget, concurrency and policy of each engine step."""
    load: LoadConfig = field(default_factory=LoadConfig)
    """Weight format and the loader class."""
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    """CUDA graphs and torch.compile."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Attention backend."""
    device: DeviceConfig = field(default_factory=DeviceConfig)
    """Where the model runs."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """What the CLI does."""
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    """Speculative decoding (vLLM's speculative_config): proposer and draft length."""
    prompts: list[str] = field(
        default_factory=lambda: ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "for line in open("]
    )
    """Prompts for task=generate."""
    prompts_file: Optional[str] = None
    """A text file (one prompt a line) or JSONL ({"prompt": ...}) that replaces ``prompts``."""
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 48})
    """SamplingParams fields for task=generate (e.g. sampling.temperature=0.8)."""
    bench: BenchConfig = field(default_factory=BenchConfig)
    """Workload and baseline of task=bench (options in conf/bench/)."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """HTTP server of task=serve."""

    def __post_init__(self) -> None:
        if self.model.path in ("", "???"):
            raise ValueError("model.path: is required; give a checkpoint directory or a preset (model=opt-125m)")
        self.device_type: str = _resolve_device(self.device.type)
        self.hf_config, self.checkpoint_dir = load_hf_config(
            self.model.path,
            inline=self.model.hf_config,
            overrides=dict(self.model.hf_overrides),
            allow_inline=self.load.format == "dummy",
        )
        if self.model.architecture:
            self.hf_config.architectures = [self.model.architecture]
        self.architecture: str = _architecture(self.hf_config)
        ModelRegistry.check_supported(self.architecture)
        check_rope_types(self.hf_config)
        self.quant_config: QuantizationConfig | None = get_quantization_config(
            self.model.quantization, self.hf_config, self.architecture
        )
        self.dtype: torch.dtype = _resolve_dtype(self.model.dtype, self.hf_config, self.device_type)
        self.kv_cache_dtype: torch.dtype = (
            self.dtype if self.cache.cache_dtype == "auto" else _DTYPES[self.cache.cache_dtype]
        )
        self.max_model_len: int = _resolve_max_model_len(self.model.max_model_len, self.hf_config)
        self.parallel.executor = {"_target_": _executor_target(self.parallel)}
        check_tensor_parallel(self.parallel.tp, self.hf_config)
        check_expert_parallel(self.parallel.tp, self.parallel.enable_expert_parallel, self.hf_config)
        if not self.attention.backend:
            self.attention.backend = {"_target_": _attention_target(self.attention.name, self.device_type)}
        self._check_scheduler()
        self.async_scheduling: bool = _resolve_async_scheduling(self.scheduler.async_scheduling, self)

    @property
    def tokenizer_path(self) -> str:
        if self.model.tokenizer:
            return self.model.tokenizer
        return str(self.checkpoint_dir) if self.checkpoint_dir is not None else self.model.path

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @functools.cached_property
    def kv_sliding_window(self) -> int | None:
        """The window behind which the KV cache frees blocks: set when every attention
        layer of the model slides, None otherwise (``core/sliding_window.py``)."""
        return model_sliding_window(self)

    def max_blocks_per_request(self, num_tokens: int | None = None) -> int:
        """KV blocks a request of ``num_tokens`` tokens (default ``max_model_len``) holds at most at once."""
        return max_blocks_per_request(
            num_tokens or self.max_model_len,
            self.cache.block_size,
            self.kv_sliding_window,
            self.scheduler.max_num_batched_tokens,
        )

    def _check_scheduler(self) -> None:
        sched = self.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"scheduler.max_num_batched_tokens={sched.max_num_batched_tokens} is smaller than "
                f"max_model_len={self.max_model_len} with chunked prefill off: a long prompt could never be "
                f"scheduled; raise it, lower model.max_model_len, or set scheduler.enable_chunked_prefill=true"
            )

    @classmethod
    def from_dictconfig(cls, cfg: DictConfig | dict) -> "VllmConfig":
        """Validate a composed config and compute the derived values."""
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        structured = OmegaConf.merge(OmegaConf.structured(cls), cfg)
        return OmegaConf.to_object(structured)

    def to_dictconfig(self) -> DictConfig:
        return OmegaConf.structured(self)


def _resolve_async_scheduling(requested: bool | None, cfg: "VllmConfig") -> bool:
    """Overlap pays where the device runs apart from the host: CUDA, one worker in this process.
    Speculative decoding needs each step's accepted tokens before it schedules the next, so it
    runs synchronously."""
    if cfg.speculative.enabled:
        if requested:
            raise ValueError(
                f"scheduler.async_scheduling=true: not supported with speculative.method={cfg.speculative.method} "
                "(speculation schedules each step after the previous one's accepted tokens); set it to false or null"
            )
        return False
    if requested is None:
        return cfg.device_type == "cuda" and cfg.world_size == 1
    return requested


def _resolve_device(device_type: str) -> str:
    if device_type == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device.type=cuda: no CUDA device is visible; use device=cpu or device=auto")
    return device_type


def _architecture(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None) or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; set model.architecture (e.g. LlamaForCausalLM)")
    return archs[0]


def _resolve_dtype(name: str, hf_config: Any, device_type: str) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device_type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    if isinstance(ckpt, str):
        ckpt = _DTYPES.get(ckpt)
    if ckpt in (None, torch.float32):
        return torch.bfloat16
    return ckpt


def _resolve_max_model_len(requested: int | None, hf_config: Any) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None)
    if requested is None:
        if limit is None:
            raise ValueError("model.max_model_len: the checkpoint names no max_position_embeddings; set it")
        return int(limit)
    if limit is not None and requested > limit:
        raise ValueError(
            f"model.max_model_len={requested}: larger than the model's max_position_embeddings={limit}"
        )
    return requested


def _executor_target(parallel: Any) -> str:
    if parallel.executor is not None:
        target = parallel.executor.get("_target_") if hasattr(parallel.executor, "get") else None
        if not target:
            raise ValueError("parallel.executor: needs a _target_ (a class path)")
        return target
    backend = parallel.backend
    if backend == "auto":
        backend = "uni" if parallel.world_size == 1 else "mp"
    if backend == "uni" and parallel.world_size > 1:
        raise ValueError(f"parallel.backend=uni: runs one rank, but parallel.tp={parallel.tp}; use mp or ray")
    return EXECUTOR_TARGETS[backend]


def _attention_target(name: str, device_type: str) -> str:
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    return ATTENTION_TARGETS[name]

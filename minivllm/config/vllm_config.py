"""The root of the config tree and the values derived from it.

``VllmConfig`` is what every component receives. Its fields are the Hydra
groups; derived values (the checkpoint's ``hf_config``, the resolved device,
dtype and ``max_model_len``) are computed in ``__post_init__`` so that a bad
config fails when it is built, before any work starts.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from minivllm.config.bench import BenchConfig
from minivllm.config.model_source import HubOptions, load_hf_config
from minivllm.core.sliding_window import max_blocks_per_request, model_sliding_window
from minivllm.distributed.pipeline import check_partition
from minivllm.distributed.utils import check_expert_parallel, check_tensor_parallel
from minivllm.layers.rotary import check_rope_types
from minivllm.lora.config import LoRAConfig
from minivllm.lora.serving import parse_lora_modules
from minivllm.model_loader.gguf_config import find_gguf_file, gguf_hf_config
from minivllm.quantization import QuantizationConfig, get_quantization_config
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
from minivllm.models.registry import POOLING_ONLY, ModelRegistry
from minivllm.plugins import load_general_plugins

logger = logging.getLogger(__name__)
ATTENTION_TARGETS = {
    "torch": "minivllm.attention.torch_backend.TorchAttentionBackend",
    "triton": "minivllm.attention.triton_backend.TritonAttentionBackend",
}
EXECUTOR_TARGETS = {
    "uni": "minivllm.executor.uniproc.UniProcExecutor",
    "mp": "minivllm.executor.multiproc.MultiprocExecutor",
    "ray": "minivllm.executor.ray_executor.RayDistributedExecutor",
    "external_launcher": "minivllm.executor.external_launcher.ExecutorWithExternalLauncher",
}
LOADER_TARGETS = {
    "gguf": "minivllm.model_loader.gguf_loader.GGUFModelLoader",
    "tensorizer": "minivllm.model_loader.tensorizer_loader.TensorizerModelLoader",
    "sharded_state": "minivllm.model_loader.sharded_state.ShardedStateLoader",
}
DEFAULT_LOADER = "minivllm.model_loader.loader.DefaultModelLoader"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KV_DTYPES = {**_DTYPES, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


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
    """Model name(s) the server answers to, comma-separated (the first is reported); defaults to model.path."""
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

    def __post_init__(self) -> None:
        check_range("serve.port", self.port, low=0, high=65535)
        check_range("serve.shutdown_timeout", self.shutdown_timeout, low=0.0)
        check_range("serve.max_n", self.max_n, low=1)
        parse_lora_modules(list(self.lora_modules))
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
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Multi-LoRA serving: adapter slots and ranks."""
    plugins: Optional[list[str]] = None
    """Entry points of the group minivllm.general_plugins to call at start-up, by name; null: all installed."""

    def __post_init__(self) -> None:
        if self.model.path in ("", "???"):
            raise ValueError("model.path: is required; give a checkpoint directory or a preset (model=opt-125m)")
        load_general_plugins(self.plugins)  # before the architecture check: a plugin may register it
        self.device_type: str = _resolve_device(self.device.type)
        if self.load.format == "auto" and self.model.path.endswith(".gguf"):
            self.load.format = "gguf"
        self.hf_config, self.checkpoint_dir = self._load_hf_config()
        if not self.load.loader:
            self.load.loader = {"_target_": LOADER_TARGETS.get(self.load.format, DEFAULT_LOADER)}
        if self.model.architecture:
            self.hf_config.architectures = [self.model.architecture]
        self.architecture: str = _architecture(self.hf_config)
        _refuse_encoder_only(self.hf_config, self.architecture)
        ModelRegistry.check_supported(self.architecture)
        check_rope_types(self.hf_config)
        self.quant_config: QuantizationConfig | None = get_quantization_config(
            self.model.quantization, self.hf_config, self.architecture
        )
        self.dtype: torch.dtype = _resolve_dtype(self.model.dtype, self.hf_config, self.device_type)
        self.kv_cache_dtype: torch.dtype = (
            self.dtype if self.cache.cache_dtype == "auto" else _KV_DTYPES[self.cache.cache_dtype]
        )
        self.max_model_len: int = _resolve_max_model_len(self.model.max_model_len, self.hf_config)
        self.parallel.executor = {"_target_": _executor_target(self.parallel)}
        check_tensor_parallel(self.parallel.tp, self.hf_config)
        self._check_pipeline_parallel()
        check_expert_parallel(self.parallel.tp, self.parallel.enable_expert_parallel, self.hf_config)
        if not self.attention.backend:
            self.attention.backend = {"_target_": _attention_target(self.attention.name, self.device_type)}
        self._check_scheduler()
        self._check_lora()
        self._check_pooling()
        self.async_scheduling: bool = _resolve_async_scheduling(self.scheduler.async_scheduling, self)

    def _load_hf_config(self) -> tuple[Any, Any]:
        """The checkpoint's config and directory; a GGUF file's config comes from its metadata."""
        overrides = dict(self.model.hf_overrides)
        if self.load.format != "gguf":
            return load_hf_config(
                self.model.path, inline=self.model.hf_config, overrides=overrides,
                allow_inline=self.load.format == "dummy", hub=self.hub_options(),
            )
        gguf_file = find_gguf_file(self.model.path)
        hf_config = gguf_hf_config(gguf_file)
        for key, value in overrides.items():
            setattr(hf_config, key, value)
        return hf_config, gguf_file.parent

    def hub_options(self, tokenizer: bool = False) -> HubOptions:
        """Where and how hub ids are found in the local HF cache (``tokenizer``: for the tokenizer)."""
        model = self.model
        revision = (model.tokenizer_revision or model.revision) if tokenizer else model.revision
        return HubOptions(revision, self.load.download_dir, model.trust_remote_code, model.code_revision)

    @property
    def tokenizer_path(self) -> str:
        if self.model.tokenizer:
            return self.model.tokenizer
        if self.model.tokenizer_revision and self.model.tokenizer_revision != self.model.revision:
            return self.model.path  # the hub id, looked up at the tokenizer's own revision
        return str(self.checkpoint_dir) if self.checkpoint_dir is not None else self.model.path

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def _check_pipeline_parallel(self) -> None:
        pp = self.parallel.pp
        if pp == 1:
            return
        if not getattr(ModelRegistry.resolve(self.architecture), "supports_pp", False):
            raise ValueError(f"parallel.pp={pp}: {self.architecture} does not support pipeline parallelism; use 1")
        if self.model.runner == "pooling":  # the pooling runner has no pipeline stages
            raise ValueError(f"parallel.pp={pp}: model.runner=pooling runs on one pipeline stage; use pp=1")
        if self.load.format == "sharded_state":  # its files are named by tp rank, which repeats on every stage
            raise ValueError(f"parallel.pp={pp}: load.format=sharded_state saves one shard per tp rank; use pp=1")
        text_config = getattr(self.hf_config, "text_config", None) or self.hf_config
        check_partition(text_config.num_hidden_layers, pp, self.parallel.pp_layer_partition)

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

    def _check_lora(self) -> None:
        uses_lora = self.serve.lora_modules or self.serve.enable_lora_runtime_updates
        if uses_lora and not self.lora.enable_lora:
            raise ValueError("serve.lora_modules / serve.enable_lora_runtime_updates: need lora.enable_lora=true")
        if self.lora.enable_lora and self.parallel.pp > 1:
            raise ValueError(f"lora.enable_lora=true with parallel.pp={self.parallel.pp}: LoRA needs parallel.pp=1")

    def _check_pooling(self) -> None:
        """Base models (no LM head) only pool; MEAN pooling needs every prompt position computed,
        so cached prefixes cannot be reused."""
        if self.architecture in POOLING_ONLY and self.model.runner != "pooling":
            raise ValueError(
                f"model.runner={self.model.runner}: {self.architecture} has no LM head, so it can only embed; "
                f"use model.runner=pooling (LLM(..., runner='pooling'))"
            )
        if self.model.runner == "pooling" and self.model.pooler_config.pooling_type == "MEAN":
            if self.cache.enable_prefix_caching:
                logger.warning("model.pooler_config.pooling_type=MEAN: turning prefix caching off (it skips tokens)")
                self.cache.enable_prefix_caching = False

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
    Pipeline stages and data-parallel replicas step synchronously."""
    par = cfg.parallel
    if par.pp > 1 or par.dp > 1:
        if requested:
            raise ValueError("scheduler.async_scheduling=true: not supported with parallel.pp > 1 or parallel.dp > 1")
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


_ENCODER_ONLY = ("bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra", "modernbert",
                 "mpnet", "nomic_bert", "camembert", "albert")


def _refuse_encoder_only(hf_config: Any, architecture: str) -> None:
    if getattr(hf_config, "model_type", None) in _ENCODER_ONLY:
        raise ValueError(
            f"architecture {architecture!r} (model_type {hf_config.model_type!r}) is an encoder-only (bidirectional) "
            f"model: not supported; minivllm runs decoder-only models, for generation or for embeddings with "
            f"model.runner=pooling (e.g. Qwen3-Embedding, gte-Qwen2)"
        )


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
        raise ValueError(
            f"parallel.backend=uni: runs one rank, but parallel.tp={parallel.tp} x parallel.pp={parallel.pp} "
            f"= {parallel.world_size}; use mp or ray"
        )
    return EXECUTOR_TARGETS[backend]


def _attention_target(name: str, device_type: str) -> str:
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    return ATTENTION_TARGETS[name]

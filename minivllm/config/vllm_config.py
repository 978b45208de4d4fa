"""The root of the config tree and the values derived from it.

``VllmConfig`` is what every component receives. Its fields are the Hydra
groups; derived values (the checkpoint's ``hf_config``, the resolved device,
dtype and ``max_model_len``) are computed in ``__post_init__`` so that a bad
config fails when it is built, before any work starts.

It describes and never builds: every check reads the checkpoint's config and
tables kept in this package (architecture names, quantization methods, rope
types). What needs the model itself comes back from the worker that loaded it
(``minivllm/kv_cache_spec.py``: the KV blocks and the sliding window), and whether
a model class splits into pipeline stages is checked by ``EngineCore`` before any
worker starts. Plugins that register architectures are called by the front ends
before they build the config (``minivllm/plugins``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from minivllm.config.architectures import POOLING_ONLY, SUPPORTED_ARCHITECTURES
from minivllm.config.bench import BenchConfig
from minivllm.config.draft_config import draft_model_config
from minivllm.config.gguf_config import find_gguf_file, gguf_hf_config
from minivllm.config.lora import LoRAConfig
from minivllm.config.model_source import HubOptions, load_hf_config
from minivllm.config.parallel_checks import check_expert_parallel, check_partition, check_tensor_parallel
from minivllm.config.quantization import QuantizationSpec, resolve_quantization
from minivllm.config.resolve import (
    DEFAULT_LOADER,
    KV_DTYPES,
    LOADER_TARGETS,
    architecture_of,
    attention_target,
    executor_target,
    refuse_encoder_only,
    resolve_async_scheduling,
    resolve_device,
    resolve_dtype,
    resolve_max_model_len,
    resolve_torch_compile,
)
from minivllm.config.rope import check_rope_types, choose_longrope_factors
from minivllm.config.scheduler_defaults import resolve_batch_limits
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
from minivllm.config.serve_config import ServeConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.tune import TuneConfig

logger = logging.getLogger(__name__)


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
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Multi-LoRA serving: adapter slots and ranks."""
    tune: TuneConfig = field(default_factory=TuneConfig)
    """Auto-tuning (``-m +tune=serving``): trial budget, seed, latency targets (docs/tuning.md)."""
    plugins: Optional[list[str]] = None
    """Entry points of the group minivllm.general_plugins to call at start-up, by name; null: all installed."""

    def __post_init__(self) -> None:
        if self.model.path in ("", "???"):
            raise ValueError("model.path: is required; give a checkpoint directory or a preset (model=opt-125m)")
        self.device_type: str = resolve_device(self.device.type)
        if self.load.format == "auto" and self.model.path.endswith(".gguf"):
            self.load.format = "gguf"
        self.hf_config, self.checkpoint_dir = self._load_hf_config()
        self.hf_text_config: Any = getattr(self.hf_config, "text_config", None) or self.hf_config
        """The language model's config: ``text_config`` of a multimodal checkpoint, else ``hf_config``."""
        self.is_multimodal: bool = getattr(self.hf_config, "vision_config", None) is not None
        """The checkpoint has a vision tower (its model takes images: ``minivllm/multimodal/``)."""
        if not self.load.loader:
            self.load.loader = {"_target_": LOADER_TARGETS.get(self.load.format, DEFAULT_LOADER)}
        if self.model.architecture:
            self.hf_config.architectures = [self.model.architecture]
        self.architecture: str = architecture_of(self.hf_config)
        refuse_encoder_only(self.hf_config, self.architecture)
        SUPPORTED_ARCHITECTURES.check_supported(self.architecture)  # plugins register theirs before this
        check_rope_types(self.hf_text_config)
        self.quant_spec: QuantizationSpec | None = resolve_quantization(
            self.model.quantization, self.hf_config, self.architecture
        )
        self.dtype: torch.dtype = resolve_dtype(self.model.dtype, self.hf_config, self.device_type)
        self.kv_cache_dtype: torch.dtype = (
            self.dtype if self.cache.cache_dtype == "auto" else KV_DTYPES[self.cache.cache_dtype]
        )
        self.max_model_len: int = resolve_max_model_len(self.model.max_model_len, self.hf_text_config)
        choose_longrope_factors(self.hf_text_config, self.max_model_len)
        self.parallel.executor = {"_target_": executor_target(self.parallel)}
        check_tensor_parallel(self.parallel.tp, self.hf_config)
        self._check_pipeline_parallel()
        check_expert_parallel(self.parallel.tp, self.parallel.enable_expert_parallel, self.hf_config)
        if not self.attention.backend:
            self.attention.backend = {"_target_": attention_target(self.attention.name, self.device_type)}
        self.scheduler, self.defaulted_scheduler_keys = resolve_batch_limits(
            self.scheduler, self.device_type, self.task.name, self.max_model_len
        )
        """The batch limits hold ints from here on; ``defaulted_scheduler_keys`` names those that were null."""
        self._check_scheduler()
        self._check_lora()
        self._check_pooling()
        self._check_speculative()
        self._check_multimodal()
        self.async_scheduling: bool = resolve_async_scheduling(self.scheduler.async_scheduling, self)
        self.torch_compile: bool = resolve_torch_compile(self.compilation.torch_compile, self.device_type)

    def _load_hf_config(self) -> tuple[Any, Any]:
        """The checkpoint's config and directory; a GGUF file's config comes from its metadata."""
        overrides = dict(self.model.hf_overrides)
        if self.load.format != "gguf":
            return load_hf_config(
                self.model.path,
                inline=self.model.hf_config,
                overrides=overrides,
                allow_inline=self.load.format == "dummy",
                hub=self.hub_options(),
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
        if self.model.runner == "pooling":  # the pooling runner has no pipeline stages
            raise ValueError(f"parallel.pp={pp}: model.runner=pooling runs on one pipeline stage; use pp=1")
        if self.load.format == "sharded_state":  # its files are named by tp rank, which repeats on every stage
            raise ValueError(f"parallel.pp={pp}: load.format=sharded_state saves one shard per tp rank; use pp=1")
        text_config = getattr(self.hf_config, "text_config", None) or self.hf_config
        check_partition(text_config.num_hidden_layers, pp, self.parallel.pp_layer_partition)

    def _check_scheduler(self) -> None:
        sched = self.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            raise ValueError(  # set explicitly: a null budget covers max_model_len without chunked prefill
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

    def _check_multimodal(self) -> None:
        """What image-taking models do not support yet is refused by name (docs/multimodal.md)."""
        if not self.is_multimodal:
            return
        refused = {
            "lora.enable_lora=true": self.lora.enable_lora,
            "model.runner=pooling": self.model.runner == "pooling",
            f"speculative.method={self.speculative.method}": self.speculative.enabled,
        }
        for key, on in refused.items():
            if on:
                raise ValueError(f"{key}: not supported with {self.architecture} (a model that takes images)")

    def _check_speculative(self) -> None:
        """The verifier runs on the last pipeline stage's sampled tokens of a generating runner;
        a draft model gets its own derived config (``draft_config``, None without one)."""
        spec = self.speculative
        self.draft_config: VllmConfig | None = None
        if not spec.enabled:
            return
        if self.parallel.pp > 1:  # the other stages would need the accepted drafts too
            raise ValueError(
                f"speculative.method={spec.method}: not supported with parallel.pp={self.parallel.pp}; use pp=1"
            )
        if self.model.runner == "pooling":  # pooling samples nothing to draft after
            raise ValueError(
                f"speculative.method={spec.method}: model.runner=pooling samples no tokens to draft after; "
                "use model.runner=generate or speculative.method=null"
            )
        if spec.uses_model:
            self.draft_config = draft_model_config(self)

    @classmethod
    def from_dictconfig(cls, cfg: DictConfig | dict) -> "VllmConfig":
        """Validate a composed config and compute the derived values."""
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        structured = OmegaConf.merge(OmegaConf.structured(cls), cfg)
        return OmegaConf.to_object(structured)

    def to_dictconfig(self) -> DictConfig:
        return OmegaConf.structured(self)

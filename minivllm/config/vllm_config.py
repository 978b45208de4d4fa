"""The root of the config tree and the values derived from it.

``VllmConfig`` is what every component receives. Its fields are the Hydra
groups; derived values (the checkpoint's ``hf_config``, the resolved device,
dtype and ``max_model_len``) are computed in ``__post_init__`` so that a bad
config fails when it is built, before any work starts. ``__post_init__``
validates and derives; the one step in it that reads disk is
``load.read_checkpoint`` (the checkpoint's config.json, or a GGUF file's
metadata), called once, and a draft model's config (``speculative.model``) is a
``VllmConfig`` of its own, built the same way.

It describes and never builds: every check reads the checkpoint's config and
tables kept in this package (architecture names, quantization methods, rope
types). What needs the model itself comes back from the worker that loaded it
(``minivllm/kv_cache_spec.py``: the KV blocks and the sliding window), and whether
a model class splits into pipeline stages is checked by ``EngineCore`` before any
worker starts. Plugins that register architectures are called by the front ends
before they build the config (``minivllm/plugins``).

The draft model's (or EAGLE head's) config is derived from the target's: the draft
runs in the target's worker, beside it: same device, dtype, KV-cache block size and
cache dtype, same context length, the target's token budget, one rank. It must
speak the target's tokenizer: the vocabulary sizes must match, and where both
checkpoints ship a ``tokenizer.json`` their vocabularies must be equal, else drafts
would be other tokens than the target reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from minivllm.config.cache import KV_DTYPES, CacheConfig
from minivllm.config.device import (
    CPU_PACK_MIN_WEIGHTS,
    AttentionConfig,
    CompilationConfig,
    DeviceConfig,
    attention_target,
    resolve_cpu_fused_decode,
    resolve_cpu_packed_linear,
    resolve_device,
    resolve_fused_sampler,
    resolve_torch_compile,
)
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.load import HubOptions, LoadConfig, read_checkpoint, safetensors_names, tokenizer_vocab
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import (
    POOLING_ONLY,
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    QuantizationSpec,
    architecture_of,
    check_rope_types,
    choose_longrope_factors,
    linear_attention_layers,
    refuse_encoder_only,
    resolve_dtype,
    resolve_max_model_len,
    resolve_quantization,
)
from minivllm.config.parallel import ParallelConfig, check_expert_parallel, check_partition, check_tensor_parallel
from minivllm.config.scheduler import SchedulerConfig, resolve_async_scheduling, resolve_batch_limits
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.task import BenchConfig, DisaggProxyConfig, ServeConfig, TaskConfig, TuneConfig

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


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
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    """KV connector (vLLM's kv_transfer_config): host-memory offload, disaggregated prefill."""
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
    disagg_proxy: DisaggProxyConfig = field(default_factory=DisaggProxyConfig)
    """The proxy of task=disagg_proxy: its prefill and decode servers."""
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
        # The one step that reads disk: the checkpoint's transformers config and its directory.
        self.hf_config, self.checkpoint_dir = read_checkpoint(self.model, self.load)
        self._derive_from_checkpoint()
        self._check_hybrid()
        self._resolve_targets()
        self._check_parallel()
        self.scheduler, self.defaulted_scheduler_keys = resolve_batch_limits(
            self.scheduler, self.device_type, self.task.name, self.max_model_len
        )
        """The batch limits hold ints from here on; ``defaulted_scheduler_keys`` names those that were null."""
        self._check_scheduler()
        self._check_lora()
        self._check_pooling()
        self._check_kv_transfer()
        self.draft_config: VllmConfig | None = self._check_speculative()
        """The draft model's (or EAGLE head's) own config; None without one."""
        self._check_multimodal()
        self._check_multi_step()
        par = self.parallel
        self.async_scheduling: bool = resolve_async_scheduling(
            self.scheduler.async_scheduling,
            tp=par.tp,
            pp=par.pp,
            dp=par.dp,
            speculative_method=self.speculative.method,
            device_type=self.device_type,
        )
        self.torch_compile: bool = resolve_torch_compile(self.compilation.torch_compile, self.device_type)
        self.cpu_packed_linear: bool = resolve_cpu_packed_linear(
            self.device.cpu_packed_linear, self.device_type, self.dtype
        )
        """``device.cpu_packed_linear`` resolved: the worker packs its linear weights for oneDNN at load."""
        self.cpu_pack_min_weights: int = 0 if self.device.cpu_packed_linear else CPU_PACK_MIN_WEIGHTS
        """The smallest layer packed: every layer when asked for (true), else the size where oneDNN wins."""
        self.cpu_fused_decode: bool = resolve_cpu_fused_decode(
            self.device.cpu_fused_decode,
            self.device_type,
            self.dtype,
            {
                "lora.enable_lora=true": self.lora.enable_lora,
                f"speculative.method={self.speculative.method}": self.speculative.enabled,
                f"cache.cache_dtype={self.cache.cache_dtype} (a KV cache not in float32)": (
                    self.kv_cache_dtype != torch.float32
                ),
            },
        )
        """``device.cpu_fused_decode`` resolved: the runner gives a qualifying Llama stack its one-call decode."""
        self.fused_sampler: bool = resolve_fused_sampler(self.compilation.fused_sampler, self.device_type)
        """``compilation.fused_sampler`` resolved: the runner's sampler runs the fused Triton kernel."""

    def _derive_from_checkpoint(self) -> None:
        """What the checkpoint's config decides: the architecture (checked against what this engine
        runs), quantization, dtypes and context length."""
        self.hf_text_config: Any = getattr(self.hf_config, "text_config", None) or self.hf_config
        """The language model's config: ``text_config`` of a multimodal checkpoint, else ``hf_config``."""
        self.is_multimodal: bool = getattr(self.hf_config, "vision_config", None) is not None
        """The checkpoint has a vision tower (its model takes images: ``minivllm/multimodal/``)."""
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

    def _check_hybrid(self) -> None:
        """Resolve ``cache.enable_prefix_caching`` (null: on, unless the model cannot). A hybrid
        model's linear-attention layers keep one state per request, not per block, so a cached
        prefix could not restore them: prefix caching asked for explicitly is refused, and so are
        the options that would need those states elsewhere (drafts, adapters, pipeline stages)."""
        linear = linear_attention_layers(self.hf_text_config)
        cache = self.cache
        if not linear:
            cache.enable_prefix_caching = cache.enable_prefix_caching is not False
            return
        where = f"{self.architecture} (linear-attention layers {linear})"
        if cache.enable_prefix_caching:
            raise ValueError(
                f"cache.enable_prefix_caching=true: not supported with {where}: their recurrent states are "
                "per request, not per KV block, so a cached prefix cannot restore them; set it to false"
            )
        if cache.enable_prefix_caching is None:
            logger.info("Prefix caching off: %s keeps per-request states a cached prefix cannot restore", where)
        cache.enable_prefix_caching = False
        refused = {
            f"speculative.method={self.speculative.method}": self.speculative.enabled,
            "lora.enable_lora=true": self.lora.enable_lora,
            f"parallel.pp={self.parallel.pp}": self.parallel.pp > 1,
        }
        for key, on in refused.items():
            if on:
                raise ValueError(f"{key}: not supported with {where}")

    def _resolve_targets(self) -> None:
        """The ``_target_`` nodes left null: the loader, the executor and the attention backend."""
        if not self.load.loader:
            self.load.loader = {"_target_": self.load.loader_target()}
        self.parallel.executor = {"_target_": self.parallel.executor_target()}
        if not self.attention.backend:
            self.attention.backend = {"_target_": attention_target(self.attention.name, self.device_type)}

    def hub_options(self, tokenizer: bool = False) -> HubOptions:
        """Where and how hub ids are found in the local HF cache (``tokenizer``: for the tokenizer)."""
        return HubOptions.of(self.model, self.load, tokenizer)

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

    def _check_parallel(self) -> None:
        """Whether the model's heads, widths, layers and experts split over the ranks."""
        check_tensor_parallel(self.parallel.tp, self.hf_config)
        self._check_pipeline_parallel()
        check_expert_parallel(self.parallel.tp, self.parallel.enable_expert_parallel, self.hf_config)

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

    def _check_multi_step(self) -> None:
        """``scheduler.num_scheduler_steps > 1`` runs several decode steps per engine step; what
        needs the host between two steps is refused by name (requests whose sampling reads the
        token history, or that have a grammar, run one step at a time instead, decided per step)."""
        steps = self.scheduler.num_scheduler_steps
        if steps == 1:
            return
        connector = (
            f"kv_transfer.kv_connector={self.kv_transfer.kv_connector} (or cache.kv_offloading_size, which "
            "picks one; a connector saves the blocks one step fills)"
        )
        refused = {
            f"speculative.method={self.speculative.method} (drafts are checked between steps)": (
                self.speculative.enabled
            ),
            f"parallel.pp={self.parallel.pp} (the last stage's tokens reach the first one through the scheduler)": (
                self.parallel.pp > 1
            ),
            "model.runner=pooling (it samples nothing)": self.model.runner == "pooling",
            connector: self.kv_transfer.enabled,
        }
        for key, on in refused.items():
            if on:
                raise ValueError(f"scheduler.num_scheduler_steps={steps}: not supported with {key}; set it to 1")

    def _check_kv_transfer(self) -> None:
        """``cache.kv_offloading_size`` picks the offloading connector; a connector needs the
        block hashes of prefix caching, and what it has not been checked with is refused."""
        kvt, size = self.kv_transfer, self.cache.kv_offloading_size
        if size is not None:
            if kvt.kv_connector not in (None, "OffloadingConnector"):
                raise ValueError(
                    f"cache.kv_offloading_size={size} with kv_transfer.kv_connector={kvt.kv_connector}: "
                    "one connector at a time; drop one of them"
                )
            kvt.kv_connector = "OffloadingConnector"
        elif kvt.kv_connector == "OffloadingConnector":
            raise ValueError("kv_transfer.kv_connector=OffloadingConnector: needs cache.kv_offloading_size (GiB)")
        if kvt.kv_connector == "OffloadingConnector" and kvt.kv_connector_extra_config:
            raise ValueError(
                f"kv_transfer.kv_connector_extra_config: OffloadingConnector takes no keys, got "
                f"{', '.join(sorted(kvt.kv_connector_extra_config))}; its size is cache.kv_offloading_size"
            )
        if kvt.kv_connector == "OffloadingConnector" and kvt.kv_role != "kv_both":
            raise ValueError(
                f"kv_transfer.kv_role={kvt.kv_role}: the host-memory tier saves and loads its own blocks; "
                "use kv_both (the default)"
            )
        if not kvt.enabled:
            return
        key = f"kv_transfer.kv_connector={kvt.kv_connector}"
        if not self.cache.enable_prefix_caching:
            raise ValueError(f"{key}: moves blocks by their prefix-cache hashes; needs cache.enable_prefix_caching")
        if self.parallel.pp > 1:
            raise ValueError(f"{key}: not supported with parallel.pp={self.parallel.pp}; use pp=1")
        if self.speculative.uses_model:
            raise ValueError(f"{key}: the draft's own KV is not transferred; use speculative.method=ngram or null")
        if self.model.runner == "pooling":
            raise ValueError(f"{key}: model.runner=pooling keeps no KV between requests")

    def _check_speculative(self) -> VllmConfig | None:
        """The verifier runs on the last pipeline stage's sampled tokens of a generating runner;
        a draft model gets its own derived config, returned (None without one)."""
        spec = self.speculative
        if not spec.enabled:
            return None
        if self.parallel.pp > 1:  # the other stages would need the accepted drafts too
            raise ValueError(
                f"speculative.method={spec.method}: not supported with parallel.pp={self.parallel.pp}; use pp=1"
            )
        if self.model.runner == "pooling":  # pooling samples nothing to draft after
            raise ValueError(
                f"speculative.method={spec.method}: model.runner=pooling samples no tokens to draft after; "
                "use model.runner=generate or speculative.method=null"
            )
        return self._draft_config() if spec.uses_model else None

    def _draft_config(self) -> VllmConfig:
        """The draft's VllmConfig (built as this config's own class); a bad draft is a ValueError naming
        ``speculative.model``."""
        spec = self.speculative
        if self.parallel.tp > 1:
            raise ValueError(
                f"speculative.method={spec.method}: the draft runs unsharded beside the target, "
                f"so parallel.tp={self.parallel.tp} is not supported; use parallel.tp=1"
            )
        eagle = spec.method == "eagle"
        if eagle and self.architecture != "LlamaForCausalLM":
            raise ValueError(
                f"speculative.method=eagle: EAGLE heads are supported for LlamaForCausalLM targets, "
                f"not {self.architecture}; use speculative.method=draft_model or ngram"
            )
        try:
            draft = type(self).from_dictconfig(self._draft_node(eagle))
        except ValueError as e:
            raise ValueError(f"speculative.model={spec.model!r}: {e}") from e
        self._check_same_vocab(draft)
        if eagle:
            self._check_eagle_head(draft)
        return draft

    def _draft_node(self, eagle: bool) -> dict[str, Any]:
        """The draft's config tree: the target's device, dtype, context, cache layout and budget, one rank."""
        return {
            "model": {
                "path": self.speculative.model,
                "dtype": _DTYPE_NAMES[self.dtype],
                "max_model_len": self.max_model_len,
                "seed": self.model.seed,
                "architecture": "LlamaForCausalLM" if eagle else None,
            },
            "device": {"type": self.device_type},
            "attention": {"name": self.attention.name},
            "cache": {"block_size": self.cache.block_size, "cache_dtype": self.cache.cache_dtype},
            "scheduler": {
                "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,
                "max_num_seqs": self.scheduler.max_num_seqs,
                "enable_chunked_prefill": self.scheduler.enable_chunked_prefill,
            },
            "load": {"download_dir": self.load.download_dir},
        }

    def _check_eagle_head(self, head: VllmConfig) -> None:
        """The head reads the target's hidden states and embeddings: same width; no HASS norms."""
        name = self.speculative.model
        want, got = self.hf_config.hidden_size, head.hf_config.hidden_size
        if want != got:
            raise ValueError(f"speculative.model={name!r}: hidden_size {got} differs from the target's {want}")
        if getattr(head.hf_config, "add_para_norm", False):
            raise ValueError(f"speculative.model={name!r}: EAGLE heads with add_para_norm (HASS) are not supported")
        if not {"fc.weight", "model.fc.weight"} & safetensors_names(head.checkpoint_dir):
            raise ValueError(f"speculative.model={name!r}: no fc.weight in its safetensors files: not an EAGLE head")

    def _check_same_vocab(self, draft: VllmConfig) -> None:
        name = self.speculative.model
        want, got = int(self.hf_text_config.vocab_size), int(draft.hf_text_config.vocab_size)
        if want != got:
            raise ValueError(
                f"speculative.model={name!r}: vocab_size {got} differs from the target's {want}; "
                "the draft must use the target's tokenizer"
            )
        mine, theirs = tokenizer_vocab(self.tokenizer_path), tokenizer_vocab(draft.tokenizer_path)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(
                f"speculative.model={name!r}: its tokenizer.json maps tokens to other ids than the target's; "
                "the draft must use the target's tokenizer"
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


@dataclass(frozen=True)
class ModelConfigView:
    """``llm.llm_engine.model_config`` with vLLM's names, read from the validated config.

    Scripts and harnesses written for vLLM read the engine's model settings there
    (``llm.llm_engine.model_config.max_model_len`` is the usual one). Our tree keeps them
    in ``VllmConfig`` (``cfg.model`` holds what was asked, ``cfg.max_model_len`` and
    ``cfg.dtype`` what was resolved from the checkpoint); this view hands over the
    resolved values under vLLM's attribute names. It is read-only and holds only what
    minivllm has: an attribute vLLM has and this view lacks is an AttributeError.
    """

    model: str
    """The checkpoint: a directory, a .gguf file or a hub id (``model.path``)."""
    tokenizer: str
    """Where the tokenizer is loaded from (``model.tokenizer``, else the checkpoint)."""
    max_model_len: int
    """Longest prompt + output, resolved from the checkpoint when not set."""
    dtype: torch.dtype
    """The weights' and activations' dtype, resolved (``auto``: the checkpoint's, bf16/fp32 by device)."""
    seed: int
    max_logprobs: int
    trust_remote_code: bool
    runner_type: str
    """``generate`` or ``pooling`` (vLLM's ``runner``)."""
    hf_config: Any
    """The checkpoint's transformers config."""
    hf_text_config: Any
    """The language model's config (``text_config`` of a multimodal checkpoint)."""

    @classmethod
    def of(cls, cfg: VllmConfig) -> ModelConfigView:
        return cls(
            model=cfg.model.path,
            tokenizer=cfg.tokenizer_path,
            max_model_len=cfg.max_model_len,
            dtype=cfg.dtype,
            seed=cfg.model.seed,
            max_logprobs=cfg.model.max_logprobs,
            trust_remote_code=cfg.model.trust_remote_code,
            runner_type=cfg.model.runner,
            hf_config=cfg.hf_config,
            hf_text_config=cfg.hf_text_config,
        )

    def get_vocab_size(self) -> int:
        return self.hf_text_config.vocab_size

    def get_hidden_size(self) -> int:
        return self.hf_text_config.hidden_size

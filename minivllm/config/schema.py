"""Structured config schemas: one dataclass per Hydra config group.

Every field has a default, a type and a one-line docstring (the docstring under
the field; `tools/gen_config_docs.py` reads them). Choices are checked in
``__post_init__`` so a bad value fails when the config is built, naming the key.
OmegaConf has no ``Literal`` type, so choices are plain ``str`` fields with an
allowed set next to them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.quantization import QUANT_METHODS
from minivllm.config.validation import check_choice, check_range

_QUALNAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")

MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other names for the same dtypes."""
RUNNERS = ("generate", "pooling")
MODALITIES = ("image",)
POOLING_TYPES = ("LAST", "MEAN")
PARALLEL_BACKENDS = ("auto", "uni", "mp", "ray", "external_launcher")
DP_BACKENDS = ("mp", "ray")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
"""Ray's placement group strategies."""
CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8", "fp8_e4m3")
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "gguf", "tensorizer", "sharded_state")
SCHEDULER_POLICIES = ("fcfs", "priority")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DEVICE_TYPES = ("auto", "cpu", "cuda")
TASKS = ("generate", "bench", "serve")


@dataclass
class PoolerConfig:
    """How model.runner=pooling turns a prompt's hidden states into one vector (vLLM's pooler_config)."""

    pooling_type: str = "LAST"
    """LAST (the last prompt token's hidden state) or MEAN (the mean over the prompt; turns prefix caching off)."""
    normalize: bool = True
    """L2-normalize embeddings unless a request says otherwise."""

    def __post_init__(self) -> None:
        self.pooling_type = str(self.pooling_type).upper()
        check_choice("model.pooler_config.pooling_type", self.pooling_type, POOLING_TYPES)


@dataclass
class ModelConfig:
    """Which checkpoint to run, in which dtype, with how much context."""

    path: str = "???"
    """Local checkpoint directory (Hugging Face layout) or hub id."""
    tokenizer: Optional[str] = None
    """Tokenizer directory or hub id; defaults to ``path``."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (checkpoint's; float32 on CPU), float32 (float), float16 (half), bfloat16."""
    max_model_len: Optional[int] = None
    """Longest prompt + output in tokens; defaults to the checkpoint's max_position_embeddings."""
    seed: int = 0
    """Seed for random weights (load.format=dummy) and for sampling without a per-request seed."""
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """Keys merged into the checkpoint's config.json (e.g. {num_hidden_layers: 2})."""
    hf_config: Optional[dict[str, Any]] = None
    """Inline config.json for presets, used when ``path`` is not found locally (with load.format=dummy)."""
    architecture: Optional[str] = None
    """Override for config.json's ``architectures[0]`` (picks the model class)."""
    max_logprobs: int = 20
    """Most logprobs a request may ask for per token; -1 puts no limit (logprobs=-1 then means the whole vocabulary)."""
    quantization: Optional[str] = None
    """Quantization method (fp8, compressed-tensors, awq, gptq); null: config.json's decides; fp8 on an unquantized checkpoint quantizes while loading."""
    revision: Optional[str] = None
    """Branch, tag or commit of a hub checkpoint looked up in the local HF cache."""
    tokenizer_revision: Optional[str] = None
    """Revision of the tokenizer's hub entry in the local HF cache; defaults to ``revision``."""
    code_revision: Optional[str] = None
    """Revision of a hub model's custom code (with trust_remote_code)."""
    trust_remote_code: bool = False
    """Let transformers run the checkpoint's own config and tokenizer code."""
    generation_config: str = "auto"
    """Default SamplingParams: auto (the checkpoint's generation_config.json), vllm (none), or a folder holding one."""
    runner: str = "generate"
    """generate (sample tokens) or pooling (return pooled hidden states: LLM.embed / LLM.encode)."""
    pooler_config: PoolerConfig = field(default_factory=PoolerConfig)
    """Pooling type and normalization for runner=pooling."""
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    """Most items per prompt by modality (on the command line: +model.limit_mm_per_prompt.image=2); a model that takes images allows 1 by default."""
    allowed_local_media_path: str = ""
    """Folder whose files a chat message may name as file:// image URLs; empty: local files are refused."""
    mm_processor_cache_gb: float = 4.0
    """Size of the front end's cache of processed images (keyed by content hash); 0 turns it off."""
    enable_sleep_mode: bool = False
    """Allow LLM.sleep / wake_up (free the KV cache and the weights' memory between rollouts)."""

    def __post_init__(self) -> None:
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        check_choice("model.dtype", self.dtype, MODEL_DTYPES + tuple(DTYPE_ALIASES))
        if self.quantization is not None:
            check_choice("model.quantization", self.quantization, QUANT_METHODS)
        if self.max_model_len is not None:
            check_range("model.max_model_len", self.max_model_len, low=1)
        if self.max_logprobs != -1:
            check_range("model.max_logprobs", self.max_logprobs, low=0)
        check_choice("model.runner", self.runner, RUNNERS)
        for modality, limit in dict(self.limit_mm_per_prompt).items():
            check_choice("model.limit_mm_per_prompt", modality, MODALITIES)
            check_range(f"model.limit_mm_per_prompt.{modality}", limit, low=0)
        check_range("model.mm_processor_cache_gb", self.mm_processor_cache_gb, low=0.0)


@dataclass
class ParallelConfig:
    """How many ranks, and the classes that run them."""

    tp: int = 1
    """Tensor-parallel size (vLLM: tensor_parallel_size)."""
    pp: int = 1
    """Pipeline-parallel size: stages of consecutive decoder layers (vLLM: pipeline_parallel_size)."""
    pp_layer_partition: Optional[list[int]] = None
    """Decoder layers per pipeline stage (e.g. [3, 2]); null splits them evenly, earlier stages taking the rest."""
    pp_microbatches: Optional[int] = None
    """Scheduled batches in flight at once through the pipeline stages (vLLM's virtual engines); null: parallel.pp."""
    dp: int = 1
    """Data-parallel size: independent engine replicas, each of tp x pp ranks (vLLM: data_parallel_size)."""
    dp_rank: int = 0
    """This replica's index in [0, dp); set by the data-parallel front end (it picks the replica's devices)."""
    dp_backend: str = "mp"
    """Where data-parallel replicas run: mp (an engine process each, this machine) or ray (a Ray actor each, any node) (vLLM: data_parallel_backend)."""
    placement_strategy: str = "PACK"
    """Ray placement group strategy for the ranks (backend=ray) and the replicas (dp_backend=ray): PACK, SPREAD, STRICT_PACK, STRICT_SPREAD."""
    placement_timeout_s: float = 120.0
    """Ray: how long to wait for the cluster to have room for every rank or replica before failing, naming what is missing."""
    enable_expert_parallel: bool = False
    """MoE models: place whole experts on the tensor-parallel ranks instead of slicing every expert."""
    backend: str = "auto"
    """Executor: auto (uni for tp=1, mp otherwise), uni, mp (one process per rank), ray, external_launcher (torchrun)."""
    executor: Any = None
    """``_target_`` node of the executor class; null follows ``backend``."""
    worker: Any = field(default_factory=lambda: {"_target_": "minivllm.worker.worker.Worker"})
    """``_target_`` node of the worker class (one device, one rank)."""
    model_runner: Any = field(default_factory=lambda: {"_target_": "minivllm.worker.model_runner.ModelRunner"})
    """``_target_`` node of the model runner (prepares inputs, runs the model, samples)."""
    worker_extension_cls: str = ""
    """Qualified name of a class whose methods every worker gains (called by LLM.collective_rpc); empty: none."""

    def __post_init__(self) -> None:
        check_range("parallel.tp", self.tp, low=1)
        check_range("parallel.pp", self.pp, low=1)
        if self.pp > 1 and self.backend in ("uni", "external_launcher"):
            raise ValueError(f"parallel.pp={self.pp}: needs parallel.backend auto, mp or ray (not {self.backend})")
        if self.pp_layer_partition is not None and self.pp == 1:
            raise ValueError("parallel.pp_layer_partition: only applies with parallel.pp > 1; leave it null")
        if self.pp_microbatches is not None:
            check_range("parallel.pp_microbatches", self.pp_microbatches, low=1)
            if self.pp == 1 and self.pp_microbatches > 1:
                raise ValueError(
                    f"parallel.pp_microbatches={self.pp_microbatches}: only applies with parallel.pp > 1; "
                    "leave it null or 1"
                )
        check_choice("parallel.backend", self.backend, PARALLEL_BACKENDS)
        if self.worker_extension_cls and not _QUALNAME.fullmatch(self.worker_extension_cls):
            raise ValueError(
                f"parallel.worker_extension_cls={self.worker_extension_cls!r}: must be a qualified class name "
                "('pkg.module.Class' or 'pkg.module:Class'), or empty"
            )
        check_range("parallel.dp", self.dp, low=1)
        check_range("parallel.dp_rank", self.dp_rank, low=0, high=self.dp - 1)
        if self.dp > 1 and self.backend == "external_launcher":
            raise ValueError(
                f"parallel.dp={self.dp}: not supported with parallel.backend=external_launcher "
                "(launch one engine per replica yourself); use auto, uni, mp or ray"
            )
        self._check_ray_fields()

    def _check_ray_fields(self) -> None:
        check_choice("parallel.dp_backend", self.dp_backend, DP_BACKENDS)
        check_choice("parallel.placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES)
        if not self.placement_timeout_s > 0:
            raise ValueError(f"parallel.placement_timeout_s={self.placement_timeout_s}: must be > 0 seconds")
        if self.dp_backend == "ray" and self.dp == 1:
            raise ValueError("parallel.dp_backend=ray: only applies with parallel.dp > 1; leave it mp")
        on_ray = self.backend == "ray" or self.dp_backend == "ray"
        if self.placement_strategy != "PACK" and not on_ray:
            raise ValueError(
                f"parallel.placement_strategy={self.placement_strategy}: only applies with parallel.backend=ray "
                "or parallel.dp_backend=ray; leave it PACK"
            )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def num_microbatches(self) -> int:
        """Batches the engine keeps in flight: ``pp_microbatches``, by default one per stage."""
        return self.pp if self.pp_microbatches is None else self.pp_microbatches

    @property
    def output_rank(self) -> int:
        """The rank whose sampled tokens the engine takes: the first of the last pipeline stage."""
        return (self.pp - 1) * self.tp


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory share and prefix caching."""

    block_size: int = 16
    """Tokens per KV-cache block."""
    gpu_memory_utilization: float = 0.9
    """Fraction of device memory the engine may use (weights, activations and KV cache)."""
    cache_dtype: str = "auto"
    """KV-cache dtype; auto follows the model dtype; fp8 (= fp8_e4m3) stores float8_e4m3fn with per-layer scales."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of identical prompt prefixes across requests."""
    num_gpu_blocks_override: Optional[int] = None
    """Use exactly this many KV blocks instead of profiling."""
    cpu_memory_gb: float = 2.0
    """Memory in GiB that stands in for device memory when the device is the CPU."""

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"cache.block_size={self.block_size}: must be a power of two between 1 and 256")
        check_range("cache.gpu_memory_utilization", self.gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        check_choice("cache.cache_dtype", self.cache_dtype, CACHE_DTYPES)
        if self.num_gpu_blocks_override is not None:
            check_range("cache.num_gpu_blocks_override", self.num_gpu_blocks_override, low=1)
        check_range("cache.cpu_memory_gb", self.cpu_memory_gb, low=0.0, low_open=True)


@dataclass
class SchedulerConfig:
    """What one engine step may hold: requests, tokens and their order."""

    max_num_seqs: int = 64
    """Most requests running at once."""
    max_num_batched_tokens: int = 2048
    """Token budget of one engine step (prefill chunks + decode tokens)."""
    enable_chunked_prefill: bool = True
    """Split prompts longer than the remaining budget across steps."""
    policy: str = "fcfs"
    """fcfs (arrival order) or priority (lower ``priority`` value first)."""
    log_stats_interval: float = 5.0
    """Seconds between engine stats log lines; 0 turns them off."""
    async_scheduling: Optional[bool] = None
    """Schedule step k+1 while the device runs step k (null: on for CUDA with one worker, off on the CPU)."""
    max_num_encoder_input_tokens: Optional[int] = None
    """Multimodal models: encoder outputs (image placeholder tokens) computed per step; null: max_num_batched_tokens."""
    encoder_cache_size: Optional[int] = None
    """Multimodal models: encoder outputs held between steps, in tokens; null: max_num_batched_tokens."""

    def __post_init__(self) -> None:
        check_range("scheduler.max_num_seqs", self.max_num_seqs, low=1)
        for key in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, key) is not None:
                check_range(f"scheduler.{key}", getattr(self, key), low=1)
        check_range("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, low=1)
        check_choice("scheduler.policy", self.policy, SCHEDULER_POLICIES)
        check_range("scheduler.log_stats_interval", self.log_stats_interval, low=0.0)


@dataclass
class LoadConfig:
    """How weights are read."""

    format: str = "auto"
    """Weights: auto (safetensors, else .bin/.pt), safetensors, pt, dummy (random), gguf, tensorizer, sharded_state."""
    loader: Any = None
    """``_target_`` node of the model loader; null follows ``format``."""
    use_tqdm: bool = True
    """Show a progress bar while loading weight files (only on a terminal)."""
    download_dir: Optional[str] = None
    """HF cache directory to find hub checkpoints in; defaults to the HF cache."""

    def __post_init__(self) -> None:
        check_choice("load.format", self.format, LOAD_FORMATS)


@dataclass
class CompilationConfig:
    """CUDA graphs and torch.compile (GPU only; ignored on the CPU)."""

    cudagraph: bool = True
    """Capture CUDA graphs for decode-only steps (CUDA only; ignored on the CPU)."""
    cudagraph_capture_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    """Batch sizes captured as CUDA graphs; other sizes pad up to the next one."""
    torch_compile: Optional[bool] = None
    """Compile the small elementwise ops (norms, rotary, gated activations) with torch.compile instead of
    running the Triton kernels and eager torch. null: on for CUDA (8% faster decode steps on an H200,
    benchmarks/RESULTS.md), off on the CPU (nothing measured to gain there; it adds start-up)."""
    max_seq_len_to_capture: int = 8192
    """Decode steps with a sequence longer than this run eagerly instead of replaying a CUDA graph."""

    def __post_init__(self) -> None:
        for size in self.cudagraph_capture_sizes:
            check_range("compilation.cudagraph_capture_sizes[]", size, low=1)
        check_range("compilation.max_seq_len_to_capture", self.max_seq_len_to_capture, low=1)


@dataclass
class AttentionConfig:
    """The attention backend."""

    name: str = "auto"
    """Backend: auto (triton on CUDA, torch on CPU), torch, triton, or custom (with a backend node)."""
    backend: Any = None
    """``_target_`` node of the backend class; null follows ``name``."""

    def __post_init__(self) -> None:
        check_choice("attention.name", self.name, ATTENTION_BACKENDS + ("custom",))
        if self.name == "custom" and not self.backend:
            raise ValueError("attention.name=custom: needs attention.backend._target_ (your backend class)")


@dataclass
class DeviceConfig:
    """Where the model runs."""

    type: str = "auto"
    """auto (cuda when available, else cpu), cpu or cuda."""

    def __post_init__(self) -> None:
        check_choice("device.type", self.type, DEVICE_TYPES)


@dataclass
class TaskConfig:
    """What `python -m minivllm` does."""

    name: str = "generate"
    """What ``python -m minivllm`` does: generate, bench or serve."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, TASKS)

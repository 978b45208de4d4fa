"""The ``model`` group: which checkpoint to run, in which dtype, with how much context.

A model describes the checkpoint and how requests may use it (logprob caps, images
per prompt); nothing here reads the checkpoint: ``VllmConfig`` resolves ``auto``
values (dtype, ``max_model_len``) from its config.json. Choices and ranges are
checked in ``__post_init__``, naming the key; vLLM's dtype aliases (half, float)
become their canonical names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.quantization import QUANT_METHODS
from minivllm.config.validation import check_choice, check_range

MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other names for the same dtypes."""
RUNNERS = ("generate", "pooling")
MODALITIES = ("image",)
POOLING_TYPES = ("LAST", "MEAN")


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

"""vLLM's ``LLM(...)`` keywords mapped onto the config tree.

Most keywords name one key (``KWARG_KEYS``); a few need their own handling
(``SPECIAL_KWARGS``). A keyword we do not implement is an error that lists the
known ones, so a vLLM script fails on its first line rather than running with
a setting silently dropped.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.store import compose, is_preset

# vLLM keyword -> key in the config tree
KWARG_KEYS = {
    "tokenizer": "model.tokenizer",
    "dtype": "model.dtype",
    "max_model_len": "model.max_model_len",
    "seed": "model.seed",
    "hf_overrides": "model.hf_overrides",
    "max_logprobs": "model.max_logprobs",
    "revision": "model.revision",
    "tokenizer_revision": "model.tokenizer_revision",
    "code_revision": "model.code_revision",
    "trust_remote_code": "model.trust_remote_code",
    "generation_config": "model.generation_config",
    "runner": "model.runner",
    "limit_mm_per_prompt": "model.limit_mm_per_prompt",
    "allowed_local_media_path": "model.allowed_local_media_path",
    "mm_processor_cache_gb": "model.mm_processor_cache_gb",
    "download_dir": "load.download_dir",
    "max_seq_len_to_capture": "compilation.max_seq_len_to_capture",
    "quantization": "model.quantization",
    "tensor_parallel_size": "parallel.tp",
    "pipeline_parallel_size": "parallel.pp",
    "data_parallel_size": "parallel.dp",
    "data_parallel_backend": "parallel.dp_backend",
    "distributed_executor_backend": "parallel.backend",
    "enable_expert_parallel": "parallel.enable_expert_parallel",
    "gpu_memory_utilization": "cache.gpu_memory_utilization",
    "block_size": "cache.block_size",
    "kv_cache_dtype": "cache.cache_dtype",
    "enable_prefix_caching": "cache.enable_prefix_caching",
    "num_gpu_blocks_override": "cache.num_gpu_blocks_override",
    "kv_cache_memory_bytes": "cache.kv_cache_memory_bytes",
    "cpu_memory_gb": "cache.cpu_memory_gb",
    "kv_offloading_size": "cache.kv_offloading_size",
    "kv_offloading_backend": "cache.kv_offloading_backend",
    "kv_transfer_config": "kv_transfer",
    "max_num_seqs": "scheduler.max_num_seqs",
    "max_num_batched_tokens": "scheduler.max_num_batched_tokens",
    "enable_chunked_prefill": "scheduler.enable_chunked_prefill",
    "scheduling_policy": "scheduler.policy",
    "async_scheduling": "scheduler.async_scheduling",
    "num_scheduler_steps": "scheduler.num_scheduler_steps",
    "load_format": "load.format",
    "cuda_graph_sizes": "compilation.cudagraph_capture_sizes",
    "attention_backend": "attention.name",
    "device": "device.type",
    "speculative_config": "speculative",
    "enable_lora": "lora.enable_lora",
    "max_loras": "lora.max_loras",
    "max_lora_rank": "lora.max_lora_rank",
    "max_cpu_loras": "lora.max_cpu_loras",
    "worker_extension_cls": "parallel.worker_extension_cls",
    "enable_sleep_mode": "model.enable_sleep_mode",
}


NOT_IMPLEMENTED = {
    "swap_space": "preemption recomputes (as in vLLM V1); there is no CPU swap space",
    "preemption_mode": "preemption always recomputes",
    "cpu_offload_gb": "weights are never offloaded to the CPU",
    "compilation_config": "use enforce_eager, cuda_graph_sizes, or overrides=['compilation.torch_compile=true']",
    "disable_custom_all_reduce": "tensor parallelism uses torch.distributed's all-reduce only",
    "hf_token": "models load from local folders or the HF cache, never downloaded",
    "skip_tokenizer_init": "the tokenizer is always loaded",
    "model_impl": "every architecture is minivllm's own (minivllm/models/)",
    "guided_decoding_backend": "structured outputs always use xgrammar",
    "structured_outputs_config": "structured outputs always use xgrammar",
}
"""vLLM keywords that minivllm knows and does not implement, each with what to do instead."""

NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "swap_space": (4,),  # vLLM's default; its V1 engine never swaps either
    "preemption_mode": ("recompute",),
    "cpu_offload_gb": (0,),
    "compilation_config": (),
    "disable_custom_all_reduce": (True,),
    "hf_token": (False,),
    "skip_tokenizer_init": (False,),
    "model_impl": ("auto", "vllm"),
    "guided_decoding_backend": ("xgrammar", "auto"),
    "structured_outputs_config": (),
}
"""Values of ``NOT_IMPLEMENTED`` keywords (besides None) that ask for what minivllm does anyway:
scripts written for vLLM often spell them out, so they are accepted and change nothing."""


def asks_for_nothing(name: str, value: Any) -> bool:
    """Whether ``name=value`` is None or one of the keyword's neutral values (type-checked:
    ``True`` is not ``1``, ``0.0`` is ``0``)."""
    if value is None:
        return True
    numeric = (int, float)
    return any(
        value == n and (type(value) is type(n) or (type(value) in numeric and type(n) in numeric))
        for n in NEUTRAL_VALUES.get(name, ())
    )


def _accepted(name: str) -> str:
    values = ", ".join(repr(v) for v in (None, *NEUTRAL_VALUES.get(name, ())))
    return f" (accepted only as {values})"


SPECIAL_KWARGS = ("enforce_eager", "disable_log_stats", "task", "served_model_name", "tokenizer_mode")
"""vLLM keywords with their own handling in ``_apply_special_kwargs``."""


def config_from_kwargs(model: str | None = None, overrides: Sequence[str] = (), **kwargs: Any) -> DictConfig:
    """The config tree for ``LLM(model, **kwargs)``: a preset name or a path, vLLM's keywords
    mapped onto their keys, then any Hydra ``overrides``."""
    group_choice = [f"model={model}"] if model and is_preset(model) else []
    cfg = compose([*group_choice, *overrides])
    if model and not group_choice:
        OmegaConf.update(cfg, "model", {"path": model, "hf_config": None, "tokenizer": None}, merge=True)
    _apply_special_kwargs(cfg, kwargs)
    kwargs = {k: v for k, v in kwargs.items() if not (k in NOT_IMPLEMENTED and asks_for_nothing(k, v))}
    unknown = sorted(set(kwargs) - set(KWARG_KEYS))
    if known_missing := [name for name in unknown if name in NOT_IMPLEMENTED]:
        reasons = "; ".join(f"{name}: {NOT_IMPLEMENTED[name]}{_accepted(name)}" for name in known_missing)
        raise ValueError(f"LLM(): vLLM keyword(s) not implemented here: {reasons}")
    if unknown:
        known = ", ".join(sorted([*KWARG_KEYS, *SPECIAL_KWARGS]))
        raise ValueError(f"LLM(): unknown or unimplemented keyword(s) {', '.join(unknown)}; known: {known}")
    for name, value in kwargs.items():
        if value is None:
            continue
        if name == "speculative_config":
            OmegaConf.update(cfg, "speculative", _group_node(name, "speculative", SpeculativeConfig, value), merge=True)
        elif name == "kv_transfer_config":
            node = _group_node(name, "kv_transfer", KVTransferConfig, value)
            for key, item in node.items():  # each key replaced whole (the extra dict too)
                OmegaConf.update(cfg, f"kv_transfer.{key}", item, merge=False)
        else:
            OmegaConf.update(cfg, KWARG_KEYS[name], value, merge=False)
    return cfg


def _apply_special_kwargs(cfg: DictConfig, kwargs: dict[str, Any]) -> None:
    """vLLM keywords that do not map one-to-one onto a key (popped from ``kwargs``)."""
    enforce_eager = kwargs.pop("enforce_eager", None)
    if enforce_eager is not None:
        OmegaConf.update(cfg, "compilation.cudagraph", not enforce_eager)
    if kwargs.pop("disable_log_stats", None):
        OmegaConf.update(cfg, "scheduler.log_stats_interval", 0.0)
    task = kwargs.pop("task", None)
    if task not in (None, "auto", "generate", "embed"):
        raise ValueError(f"LLM(): task={task!r}: must be generate or embed (or use runner=generate/pooling)")
    if task == "embed":
        OmegaConf.update(cfg, "model.runner", "pooling")
    tokenizer_mode = kwargs.pop("tokenizer_mode", None)
    if tokenizer_mode not in (None, "auto", "hf"):  # both are transformers' AutoTokenizer, what is always used
        raise ValueError(
            f"LLM(): tokenizer_mode={tokenizer_mode!r}: only 'auto' (or 'hf': transformers' AutoTokenizer) "
            "is supported; 'slow', 'mistral' and 'custom' are not"
        )
    names = kwargs.pop("served_model_name", None)
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)
        if not names or not all(isinstance(n, str) and n and "," not in n for n in names):
            raise ValueError(f"LLM(): served_model_name={names!r}: must be a name or a list of names (no commas)")
        OmegaConf.update(cfg, "serve.served_model_name", ",".join(names))


def name_the_keyword(message: str, kwargs: dict[str, Any]) -> str:
    """A config error about a key that an ``LLM(...)`` keyword of another name set, with that
    keyword added: ``parallel.tp=3: ...`` means little to whoever wrote ``tensor_parallel_size=3``."""
    for name in kwargs:
        key = KWARG_KEYS.get(name)
        if key and key.rsplit(".", 1)[-1] != name and message.startswith((f"{key}=", f"{key}:")):
            return f"{message} (LLM keyword {name})"
    return message


def _group_node(keyword: str, group: str, schema: type, value: Any) -> dict:
    """``LLM(<keyword>={...})`` (``speculative_config``, ``kv_transfer_config``): vLLM's dict, or
    the group's config dataclass itself, checked for unknown keys, as the ``group``'s node."""
    if isinstance(value, schema):
        value = {f.name: getattr(value, f.name) for f in fields(schema)}
    if not isinstance(value, dict):
        raise ValueError(f"{keyword}={value!r}: must be a dict of {group}.* keys")
    known = [f.name for f in fields(schema)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{keyword}: unknown or unsupported key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return dict(value)

"""Values the config derives rather than stores: the device, dtype, context
length, architecture, and the ``_target_`` classes a name or backend selects.

Each function fails with a message naming the key and what is allowed, so a bad
config stops when ``VllmConfig`` is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

ATTENTION_TARGETS = {
    "torch": "minivllm.attention.torch_backend.TorchAttentionBackend",
    "triton": "minivllm.attention.triton_backend.TritonAttentionBackend",
}
EXECUTOR_TARGETS = {
    "uni": "minivllm.executor.base.UniProcExecutor",
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
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KV_DTYPES = {**DTYPES, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def resolve_async_scheduling(requested: bool | None, cfg: VllmConfig) -> bool:
    """Overlap pays where the device runs apart from the host: CUDA, one worker in this process.
    Pipeline stages and data-parallel replicas step synchronously; so does speculative decoding,
    which needs each step's accepted tokens before it schedules the next."""
    par = cfg.parallel
    if par.pp > 1 or par.dp > 1:
        if requested:
            raise ValueError("scheduler.async_scheduling=true: not supported with parallel.pp > 1 or parallel.dp > 1")
        return False
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


def resolve_torch_compile(requested: bool | None, device_type: str) -> bool:
    """``compilation.torch_compile``: null follows the device (on for CUDA, where it was measured
    faster, off on the CPU)."""
    return device_type == "cuda" if requested is None else requested


def resolve_device(device_type: str) -> str:
    if device_type == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device.type=cuda: no CUDA device is visible; use device=cpu or device=auto")
    return device_type


ENCODER_ONLY = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "deberta",
    "deberta-v2",
    "electra",
    "modernbert",
    "mpnet",
    "nomic_bert",
    "camembert",
    "albert",
)


def refuse_encoder_only(hf_config: Any, architecture: str) -> None:
    if getattr(hf_config, "model_type", None) in ENCODER_ONLY:
        raise ValueError(
            f"architecture {architecture!r} (model_type {hf_config.model_type!r}) is an encoder-only (bidirectional) "
            f"model: not supported; minivllm runs decoder-only models, for generation or for embeddings with "
            f"model.runner=pooling (e.g. Qwen3-Embedding, gte-Qwen2)"
        )


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None) or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; set model.architecture (e.g. LlamaForCausalLM)")
    return archs[0]


def resolve_dtype(name: str, hf_config: Any, device_type: str) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device_type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    if isinstance(ckpt, str):
        ckpt = DTYPES.get(ckpt)
    if ckpt in (None, torch.float32):
        return torch.bfloat16
    return ckpt


def resolve_max_model_len(requested: int | None, hf_config: Any) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None)
    if requested is None:
        if limit is None:
            raise ValueError("model.max_model_len: the checkpoint names no max_position_embeddings; set it")
        return int(limit)
    if limit is not None and requested > limit:
        raise ValueError(f"model.max_model_len={requested}: larger than the model's max_position_embeddings={limit}")
    return requested


def executor_target(parallel: Any) -> str:
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


def attention_target(name: str, device_type: str) -> str:
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    return ATTENTION_TARGETS[name]

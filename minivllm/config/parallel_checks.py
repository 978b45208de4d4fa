"""Whether a model's shapes split over the configured ranks: tensor-parallel heads and widths,
experts, pipeline stages. Pure functions of the checkpoint's config (no model is built), so a
bad split fails when ``VllmConfig`` is built, naming the key; ``distributed/`` and the MoE
models use the same functions when they place layers and experts.
"""

from __future__ import annotations

from typing import Any


def check_tensor_parallel(tp: int, hf_config: Any) -> None:
    """Raise ValueError (naming ``parallel.tp``) when the model's shapes cannot be split ``tp`` ways.

    Query heads and MLP width must divide evenly; KV heads must divide evenly
    or, with fewer KV heads than ranks, ``tp`` must be a multiple of them (each
    KV head is then replicated). The vocabulary needs no check: its last shard is padded.
    """
    if tp == 1:
        return
    text_config = getattr(hf_config, "text_config", None) or hf_config
    heads = getattr(text_config, "num_attention_heads", None)
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    if heads is not None and heads % tp:
        raise ValueError(f"parallel.tp={tp}: the model's num_attention_heads={heads} is not divisible by it")
    if kv_heads is not None and kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"parallel.tp={tp}: the model's num_key_value_heads={kv_heads} neither divides it nor is divisible by it"
        )
    for key in ("intermediate_size", "ffn_dim"):
        width = getattr(text_config, key, None)
        if isinstance(width, int) and width % tp:
            raise ValueError(f"parallel.tp={tp}: the model's {key}={width} is not divisible by it")


def num_experts(hf_config: Any) -> int:
    """Routed experts per MoE layer (Mixtral's num_local_experts, Qwen3-MoE's num_experts); 0 when dense."""
    text_config = getattr(hf_config, "text_config", None) or hf_config
    return int(getattr(text_config, "num_local_experts", None) or getattr(text_config, "num_experts", None) or 0)


def check_expert_parallel(tp: int, enabled: bool, hf_config: Any) -> None:
    """Raise ValueError when the experts cannot be spread over ``tp`` ranks the chosen way.

    Expert parallel needs a MoE model whose expert count ``tp`` divides; without
    it, each expert's intermediate dim (``moe_intermediate_size``, else
    ``intermediate_size``) is sliced and must divide.
    """
    experts = num_experts(hf_config)
    if enabled and not experts:
        raise ValueError("parallel.enable_expert_parallel=true: the model has no experts (not a MoE model); unset it")
    if tp == 1 or not experts:
        return
    text_config = getattr(hf_config, "text_config", None) or hf_config
    if enabled and experts % tp:
        raise ValueError(
            f"parallel.tp={tp}: with parallel.enable_expert_parallel=true the model's {experts} experts "
            f"must be divisible by it"
        )
    width = getattr(text_config, "moe_intermediate_size", None) or getattr(text_config, "intermediate_size", 0)
    if not enabled and width % tp:
        raise ValueError(
            f"parallel.tp={tp}: each expert's intermediate size {width} is not divisible by it; "
            f"set parallel.enable_expert_parallel=true to place whole experts on ranks instead"
        )


def even_partition(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage, as even as possible; the earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


def check_partition(num_layers: int, num_stages: int, partition: list[int] | None) -> list[int]:
    """The partition to use; ValueError (naming the keys) when it cannot be."""
    if num_layers < num_stages:
        raise ValueError(f"parallel.pp={num_stages}: the model has only {num_layers} decoder layers; use at most that")
    if partition is None:
        return even_partition(num_layers, num_stages)
    parts = list(partition)
    if len(parts) != num_stages or any(p < 1 for p in parts) or sum(parts) != num_layers:
        raise ValueError(
            f"parallel.pp_layer_partition={parts}: needs {num_stages} entries (parallel.pp), each at least 1, "
            f"summing to the model's {num_layers} decoder layers"
        )
    return parts

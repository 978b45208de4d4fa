"""Helpers for starting tensor-parallel ranks: ports, threads, shape checks."""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"


def get_open_port(host: str = "") -> int:
    """A port that was free a moment ago on ``host`` (all interfaces by default,
    as the rendezvous store listens on all); the OS picks it when binding port 0.

    Another process may take it before rank 0 binds it; callers retry on
    ``is_address_in_use``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_address_in_use(message: str) -> bool:
    """Whether an error message (from the rendezvous store) is EADDRINUSE."""
    text = message.lower()
    return "eaddrinuse" in text or "address already in use" in text


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(num_local_ranks: int) -> int:
    """Intra-op threads for each rank so the ranks on one machine share its cores
    instead of each starting one thread per core."""
    return max(1, available_cpus() // max(1, num_local_ranks))


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


def retry_on_address_in_use(start: Callable[[], None], stop: Callable[[], None], what: str, tries: int = 3) -> None:
    """Run ``start`` (spawn ranks and rendezvous); when it fails because the chosen
    port was taken meanwhile, ``stop`` the ranks and try again with a new port.
    Any other failure is raised at once."""
    for attempt in range(1, tries + 1):
        try:
            start()
            return
        except RuntimeError as err:
            stop()
            if not is_address_in_use(str(err)):
                raise
            if attempt == tries:
                raise RuntimeError(f"{what}: the rendezvous port was already in use on {tries} tries: {err}") from err
            logger.warning("%s: rendezvous port already in use; retrying with another (%s)", what, err)

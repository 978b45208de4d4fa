"""The ``parallel`` group: how many ranks and replicas, the classes that run them, and
whether a model's shapes split over them.

``tp x pp`` ranks make one engine (``world_size``); ``dp`` engines of that size
serve side by side, each told its ``dp_rank``. Every rule that needs only these
keys is checked in ``ParallelConfig``; the ones that need the checkpoint (heads
divisible by tp, layers per pipeline stage, experts) are the ``check_*`` functions
below: pure functions of the checkpoint's config (no model is built), so a bad split
fails when ``VllmConfig`` is built, naming the key; ``distributed/`` and the MoE
models use the same functions when they place layers and experts. The Ray fields
apply only when something runs on Ray, and are refused otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.model import check_choice, check_range

_QUALNAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")

PARALLEL_BACKENDS = ("auto", "uni", "mp", "ray", "external_launcher")
DP_BACKENDS = ("mp", "ray")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
"""Ray's placement group strategies."""
EXECUTOR_TARGETS = {
    "uni": "minivllm.executor.base.UniProcExecutor",
    "mp": "minivllm.executor.multiproc.MultiprocExecutor",
    "ray": "minivllm.executor.ray_executor.RayDistributedExecutor",
    "external_launcher": "minivllm.executor.external_launcher.ExecutorWithExternalLauncher",
}


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

    def executor_target(self) -> str:
        """The executor class: ``executor``'s ``_target_``, else the one ``backend`` picks."""
        if self.executor is not None:
            target = self.executor.get("_target_") if hasattr(self.executor, "get") else None
            if not target:
                raise ValueError("parallel.executor: needs a _target_ (a class path)")
            return target
        backend = self.backend
        if backend == "auto":
            backend = "uni" if self.world_size == 1 else "mp"
        if backend == "uni" and self.world_size > 1:
            raise ValueError(
                f"parallel.backend=uni: runs one rank, but parallel.tp={self.tp} x parallel.pp={self.pp} "
                f"= {self.world_size}; use mp or ray"
            )
        return EXECUTOR_TARGETS[backend]


# Whether the model's shapes split over the ranks.


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
    for key in ("intermediate_size", "ffn_dim", "linear_num_key_heads", "linear_num_value_heads"):
        width = getattr(text_config, key, None)
        if isinstance(width, int) and width % tp:
            raise ValueError(f"parallel.tp={tp}: the model's {key}={width} is not divisible by it")


def num_experts(hf_config: Any) -> int:
    """Routed experts per MoE layer (Mixtral's num_local_experts, Qwen3-MoE's num_experts, DeepSeek's
    n_routed_experts); 0 when dense."""
    text_config = getattr(hf_config, "text_config", None) or hf_config
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if getattr(text_config, key, None):
            return int(getattr(text_config, key))
    return 0


def check_expert_parallel(tp: int, enabled: bool, hf_config: Any) -> None:
    """Raise ValueError when the experts cannot be spread over ``tp`` ranks the chosen way.

    Expert parallel needs a MoE model whose expert count ``tp`` divides; without
    it, each expert's intermediate dim (``moe_intermediate_size``, else
    ``intermediate_size``) is sliced and must divide.
    """
    experts = num_experts(hf_config)
    if enabled and not experts:
        raise ValueError("parallel.enable_expert_parallel=true: the model has no experts (not a MoE model); unset it")
    text_config = getattr(hf_config, "text_config", None) or hf_config
    if enabled and getattr(text_config, "model_type", None) == "gpt_oss":
        raise ValueError(
            "parallel.enable_expert_parallel=true: gpt-oss's experts are split over the tensor-parallel "
            "ranks only (its biased experts have no expert-parallel path); unset it"
        )
    if tp == 1 or not experts:
        return
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

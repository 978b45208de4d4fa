"""The ``parallel`` group: how many ranks and replicas, and the classes that run them.

``tp x pp`` ranks make one engine (``world_size``); ``dp`` engines of that size
serve side by side, each told its ``dp_rank``. Every rule that needs only these
keys is checked here; the ones that need the checkpoint (heads divisible by tp,
layers per pipeline stage, experts) are in ``parallel_checks.py``. The Ray
fields apply only when something runs on Ray, and are refused otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.validation import check_choice, check_range

_QUALNAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")

PARALLEL_BACKENDS = ("auto", "uni", "mp", "ray", "external_launcher")
DP_BACKENDS = ("mp", "ray")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
"""Ray's placement group strategies."""


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

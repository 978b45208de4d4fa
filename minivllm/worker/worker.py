"""A worker: one device, one rank. Owns the model runner and sizes the KV cache.

Executors reach the model runner only through the worker: every step passes
``execute_model_async`` (``execute_model`` too), so a worker subclass (named by
``parallel.worker._target_``) sees every step, synchronous or launched ahead.
"""

from __future__ import annotations

import logging
import os
import resource

import torch
import torch.distributed as dist

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.parallel_state import destroy_model_parallel, init_model_parallel
from minivllm.distributed.utils import cpu_threads, keep_freed_pages
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.layers.attention import uniform_sliding_window
from minivllm.models.utils import pack_cpu_weights, packed_cpu_weight_bytes
from minivllm.outputs import ModelRunnerOutput, StepResult
from minivllm.plugins import load_general_plugins
from minivllm.utils import instantiate_target
from minivllm.worker.sleep import (
    SleepState,
    bring_weights_back,
    check_level,
    check_tags,
    put_weights_away,
    release_freed_memory,
)

logger = logging.getLogger(__name__)
GiB = 1 << 30


class Worker:
    def __init__(
        self, cfg: VllmConfig, rank: int = 0, distributed_init_method: str | None = None, num_threads: int | None = None
    ) -> None:
        load_general_plugins(cfg.plugins)  # in a worker process, this is their first chance to run
        self.cfg = cfg
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.num_threads = num_threads
        self.device = torch.device("cpu")
        self.model_runner = None
        self.reports_output = rank == cfg.parallel.output_rank
        """Whether this rank's steps return their output (None otherwise). The output rank's only,
        unless the executor needs every rank's and sets it (the external launcher: each process's
        own scheduler advances with it)."""
        self.num_blocks = 0
        """KV blocks ``initialize_cache`` allocated (sleep mode allocates as many on waking)."""
        self.sleep_state = SleepState()

    def init_device(self) -> None:
        if self.cfg.device_type == "cuda":
            first = self.cfg.parallel.dp_rank * self.cfg.world_size  # data-parallel replicas take disjoint GPUs
            self.device = torch.device("cuda", (first + self.rank) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        if self.device.type == "cpu":
            threads = cpu_threads(self.cfg.device.cpu_threads, self.num_threads)
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
            keep_freed_pages()  # activations reused from the heap, not faulted in afresh every step
            logger.info("CPU worker rank %d: %d intra-op threads", self.rank, threads)
        elif self.num_threads:
            torch.set_num_threads(self.num_threads)
        if self.cfg.world_size > 1:
            backend = "nccl" if self.cfg.device_type == "cuda" else "gloo"
            dist.init_process_group(
                backend, init_method=self.distributed_init_method, rank=self.rank, world_size=self.cfg.world_size
            )
            init_model_parallel(self.cfg.parallel.tp, self.cfg.parallel.pp, self.cfg.parallel.pp_layer_partition)
        torch.manual_seed(self.cfg.model.seed)

    def load_model(self) -> None:
        self.model_runner = instantiate_target(self.cfg.parallel.model_runner, cfg=self.cfg, device=self.device)
        self.model_runner.load_model()

    def get_model(self) -> torch.nn.Module:
        """This rank's model (its shard of the weights under tensor parallelism)."""
        return self.model_runner.model

    def determine_kv_cache_spec(self) -> KVCacheSpec:
        """This rank's KV cache as the engine plans with it: the blocks that fit, the
        sliding window of the model it loaded and what a block costs (``KVCacheSpec``)."""
        window = uniform_sliding_window(self.model_runner.model)
        num_blocks = self.determine_num_available_blocks()
        runner = self.model_runner
        return KVCacheSpec(
            self.cfg.cache.block_size,
            num_blocks,
            window,
            runner.kv_cache_bytes_per_block(),
            num_state_slots=runner.num_state_slots(),
            state_slot_bytes=runner.state_bytes_per_slot(),
        )

    def determine_num_available_blocks(self) -> int:
        """KV blocks that fit: (device memory x utilization - peak usage - encoder cache - MLA workspace) / bytes per block.

        The peak is measured around a forward pass at the full token budget and the sampler at its
        widest step (``max_num_seqs`` rows); for a model that takes images, around the vision
        encoder on one step's largest input too, and its whole encoder cache is reserved (0 bytes
        for a text-only model), and an MLA model's expanded context workspace: ``profile.py``.
        ``cache.kv_cache_memory_bytes`` replaces all of this with an exact budget (vLLM's
        ``kv_cache_memory_bytes``), on the CPU and CUDA alike.
        A hybrid model's linear-attention state slots (one per ``max_num_seqs``) come out of the
        same budget first: the blocks get what they leave.
        On the CPU, ``cache.cpu_memory_gb`` stands in for device memory and the
        peak is the weights (and their packed copies, ``device.cpu_packed_linear``) plus the growth of the
        process's resident high-water mark.
        """
        override = self.cfg.cache.num_gpu_blocks_override
        if override is not None:
            return override
        budget = self.cfg.cache.kv_cache_memory_bytes
        states = self.model_runner.num_state_slots() * self.model_runner.state_bytes_per_slot()
        if budget is not None:  # an exact budget: no profile, no memory fraction
            per_block = self.model_runner.kv_cache_bytes_per_block()
            if budget - states < per_block:
                raise ValueError(
                    f"cache.kv_cache_memory_bytes={budget}: less than one KV block of this model "
                    f"({per_block} bytes at cache.block_size={self.cfg.cache.block_size})"
                    + (f" beside its linear-attention state slots ({states} bytes)" if states else "")
                    + "; raise it"
                )
            return (budget - states) // per_block
        total, peak = self._profile_memory()
        encoder_cache = self.model_runner.encoder_cache_bytes()  # images: held between steps, outside the peak
        workspace = self.model_runner.mla_workspace_bytes()  # MLA context pieces: no profiled prompt has context
        free = total * self.cfg.cache.gpu_memory_utilization - peak - encoder_cache - workspace - states
        per_block = self.model_runner.kv_cache_bytes_per_block()
        num_blocks = int(free // per_block)
        if num_blocks < 1:
            raise ValueError(
                f"cache.gpu_memory_utilization={self.cfg.cache.gpu_memory_utilization}: leaves no room for the KV "
                f"cache (device {total / GiB:.2f} GiB, model peak {peak / GiB:.2f} GiB"
                + (f", encoder cache {encoder_cache / GiB:.2f} GiB" if encoder_cache else "")
                + (f", MLA context workspace {workspace / GiB:.2f} GiB" if workspace else "")
                + "); raise it"
                + (", or raise cache.cpu_memory_gb" if self.device.type == "cpu" else "")
                + (", or lower scheduler.encoder_cache_size" if encoder_cache else "")
            )
        return num_blocks

    def _profile_memory(self) -> tuple[float, float]:
        self.model_runner.prepare_profile()  # outside the measured region: it loads a processor
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.model_runner.profile_run()
            torch.cuda.synchronize(self.device)
            _, total = torch.cuda.mem_get_info(self.device)
            return float(total), float(torch.cuda.max_memory_allocated(self.device))
        model = self.model_runner.model
        weights = sum(p.numel() * p.element_size() for p in model.parameters()) + packed_cpu_weight_bytes(model)
        drafter = getattr(self.model_runner, "drafter", None)  # speculative.method=draft_model
        if drafter is not None:
            weights += drafter.weight_bytes()
        _reset_peak_rss()
        before = _rss_bytes()
        self.model_runner.profile_run()
        activations = max(0.0, _peak_rss_bytes() - before)
        return self.cfg.cache.cpu_memory_gb * GiB, float(weights + activations)

    def initialize_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.model_runner.init_kv_cache(num_blocks)
        self.model_runner.init_kv_connector()
        self.model_runner.capture_cuda_graphs()

    # ---- sleep mode (worker/sleep.py) ----------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the KV cache, and offload (level 1) or discard (level 2) the weights."""
        check_level(level)
        state = self.sleep_state
        if state.asleep:
            raise ValueError(f"sleep: already asleep ({', '.join(sorted(state.asleep))}); wake_up first")
        self.model_runner.release_kv_cache()
        put_weights_away(self.model_runner.model, level, state)
        state.asleep, state.level = {"weights", "kv_cache"}, level
        release_freed_memory(self.device)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back the weights and/or the KV cache (both when ``tags`` is None); once both are
        back, capture the CUDA graphs again (they point at the new tensors)."""
        state = self.sleep_state
        for tag in check_tags(tags):
            if tag not in state.asleep:
                continue
            if tag == "weights":
                bring_weights_back(self.model_runner.model, self.device, state)
                if self.cfg.cpu_packed_linear:  # level 2 dropped the packed copies with the weights
                    pack_cpu_weights(self.model_runner.model, self.cfg.cpu_pack_min_weights)
            else:
                self.model_runner.init_kv_cache(self.num_blocks)
            state.asleep.discard(tag)
        if not state.asleep and state.level:
            state.level = 0
            self.model_runner.capture_cuda_graphs()

    def is_sleeping(self) -> bool:
        return bool(self.sleep_state.asleep)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepResult | None:
        """Launch one step; where this rank ``reports_output`` the result's ``result()`` waits
        for its sampled tokens. Elsewhere the step completes here and None is returned (every
        rank keeps the tokens it sampled: they are the next step's inputs)."""
        launched = self.model_runner.execute_model_async(scheduler_output)
        if self.reports_output:
            return launched
        launched.result()
        return None

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """One step to its end: the output where this rank ``reports_output``, None elsewhere."""
        launched = self.execute_model_async(scheduler_output)
        return launched.result() if launched is not None else None

    def shutdown(self) -> None:
        if dist.is_available() and dist.is_initialized():
            destroy_model_parallel()
            dist.destroy_process_group()


def _rss_bytes() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> float:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux carries that
    over from the parent through fork and exec, so a spawned tp worker would report
    its driver's peak as its own."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _reset_peak_rss() -> None:
    """Restart the peak at the current RSS (Linux >= 4.0), so that a profile sees its
    own peak, not one left by earlier work in the process (loading, a freed model)."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass

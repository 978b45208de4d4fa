"""The model runner: scheduler output in, sampled tokens out, on one device.

Per step it (1) folds the scheduler's deltas into the persistent batch and the
other per-request stores (``request_states.py``; ``input_batch.py``: rows added,
removed, compacted; block tables grown in place), (2) computes the flat step
inputs with numpy and sends them to the device in one copy (``step_inputs.py``),
(3) runs the model, and (4) samples for the requests whose known tokens are now
all computed (a request mid-way through a chunked prefill samples nothing). The batch holds the sampled ids
(``InputBatch.hold_sampled``); they come back to the host in the step's one
synchronization (``pending_output.py``), which with async scheduling happens
after the next step is already launched: the next step then reads those tokens
from the device (its *placeholders*). The batch stores them in its rows at the
start of the first step after they were read.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.ops.checks import check_fp8_kv_capability
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.parallel_state import broadcast_from_first
from minivllm.distributed.pipeline import IntermediateTensors, PipelineStage, pipeline_stage
from minivllm.layers.attention import attention_layers
from minivllm.layers.compile import compile_small_ops
from minivllm.layers.rotary import share_cos_sin_caches
from minivllm.lora.manager import LoRAModelManager
from minivllm.models.interfaces import supports_mrope, supports_multimodal
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.outputs import DoneOutput, ModelRunnerOutput
from minivllm.pooling.pooler import Pooler
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.eagle import model_proposer
from minivllm.spec_decode.verifier import DraftVerifier
from minivllm.structured_output.backend import bitmask_for_rows
from minivllm.utils import cdiv, instantiate_target
from minivllm.worker.batch_sampling import BatchSampling
from minivllm.worker.cuda_graphs import CUDAGraphRunner
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.kv_cache_tensors import bind_kv_caches, kv_cache_shape, unbind_kv_caches
from minivllm.worker.mm_runner import MultiModalRunner
from minivllm.worker.mrope_positions import MRopePositions
from minivllm.worker.pending_output import PendingOutput
from minivllm.worker.prompt_logprobs_requests import PromptLogprobsRequests
from minivllm.worker.request_states import update_states
from minivllm.worker.runner_profile import ProfileRun
from minivllm.worker.sampling_metadata import from_batch
from minivllm.worker.scheduled_rows import ScheduledRows
from minivllm.worker.step_inputs import StepInputBuilder, StepInputs

logger = logging.getLogger(__name__)


class ModelRunner(ProfileRun):
    def __init__(self, cfg: VllmConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.block_size = cfg.cache.block_size
        self.model: nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.cuda_graphs: CUDAGraphRunner | None = None
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(cfg.model.seed))
        self.pooler = Pooler(cfg.model.pooler_config.pooling_type) if cfg.model.runner == "pooling" else None
        max_reqs, max_blocks = cfg.scheduler.max_num_seqs, cdiv(cfg.max_model_len, self.block_size)
        self.batch = InputBatch(max_reqs, cfg.max_model_len, max_blocks)
        self.inputs = StepInputBuilder(
            cfg.scheduler.max_num_batched_tokens, max_reqs, max_blocks, self.block_size, device
        )
        self.prompt_logprobs = PromptLogprobsRequests()
        self.sampling = BatchSampling(self.batch, device)
        """The sampler's metadata for a step's rows, cached while the batch is unchanged."""
        self.rows_of = ScheduledRows(max_reqs)
        spec = cfg.speculative
        self.spec = DraftVerifier(self.sampler, self.block_size, device, from_batch) if spec.enabled else None
        """Speculative decoding: drafts into the batch, verified tokens out; None when off."""
        self.drafter = (
            model_proposer(cfg, self.sampler, device, StepInputBuilder, from_batch) if spec.uses_model else None
        )
        """speculative.method=draft_model or eagle: the draft model or head, run after each step; None otherwise."""
        self.pipeline: PipelineStage | None = None
        """This rank's link to its neighbouring stages (set in ``load_model`` when parallel.pp > 1)."""
        self.lora: LoRAModelManager | None = None
        """Adapter slots and per-token slot indices (set in ``load_model`` when lora.enable_lora; then pp == 1)."""
        self.mrope: MRopePositions | None = None
        """(3, T) positions per step (set in ``load_model`` for a model that ``supports_mrope``); None otherwise."""
        self.mm: MultiModalRunner | None = None
        """Images: the vision encoder's outputs and their merge (set in ``load_model`` for a model that takes them)."""
        self.profile_images: list[MultiModalFeature] | None = None
        """The memory profile's encoder input, between ``prepare_profile`` and ``profile_run``."""

    # ---- set-up -------------------------------------------------------------------
    def load_model(self) -> None:
        self.attn_backend = instantiate_target(self.cfg.attention.backend)
        self._check_kv_cache_dtype()
        loader = instantiate_target(self.cfg.load.loader)
        self.model = loader.load_model(self.cfg, self.attn_backend, self.device)
        share_cos_sin_caches(self.model, self.cfg.max_model_len, self.device)
        if self.cfg.torch_compile:
            compile_small_ops(self.model)
        self.attention_layers = attention_layers(self.model)
        if supports_multimodal(self.model):
            self.mm = MultiModalRunner(self.model, self.device)
        self.pipeline = pipeline_stage(self.cfg, self.model, self.device)  # None unless parallel.pp > 1
        if self.cfg.lora.enable_lora:
            self.lora = LoRAModelManager(self.model, self.cfg.lora, self.cfg.hf_config, self.cfg.dtype, self.device)
        if self.drafter is not None:
            self.drafter.load_model(self.attn_backend, self.model)
        if supports_mrope(self.model):
            self._check_mrope()
            self.mrope = MRopePositions(self.model, self.device)

    def _check_mrope(self) -> None:
        """Speculative decoding builds (T,) positions of its own (pipeline stages are refused by ``supports_pp``)."""
        if self.cfg.speculative.enabled:
            raise ValueError(f"speculative decoding: {self.cfg.architecture} takes M-RoPE positions; turn it off")

    def _check_kv_cache_dtype(self) -> None:
        """An fp8 KV cache on a GPU whose Triton cannot compile the fp8 kernels (below sm_89):
        refused here, before the weights load, rather than at the first kernel launch."""
        if (
            self.cfg.kv_cache_dtype == FP8_KV_DTYPE
            and self.device.type == "cuda"
            and self.attn_backend.name == "triton"
        ):
            check_fp8_kv_capability(torch.cuda.get_device_capability(self.device), self.cfg.cache.cache_dtype)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return kv_cache_shape(self.attention_layers, num_blocks, self.block_size)

    def kv_cache_bytes_per_block(self) -> int:
        per_layer = int(np.prod(self.kv_cache_shape(1)))
        draft = self.drafter.kv_cache_bytes_per_block() if self.drafter is not None else 0
        return per_layer * len(self.attention_layers) * self.cfg.kv_cache_dtype.itemsize + draft

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate one (2, num_blocks, block_size, kv_heads, head_dim) tensor per layer and bind it."""
        shape = self.kv_cache_shape(num_blocks)
        self.kv_caches = bind_kv_caches(self.attention_layers, shape, self.cfg.kv_cache_dtype, self.device)
        if self.drafter is not None:  # its own tensors over the same block ids
            self.drafter.init_kv_cache(num_blocks)

    def release_kv_cache(self) -> None:
        """Drop the KV cache and the CUDA graphs that read it (sleep mode); ``init_kv_cache``
        and ``capture_cuda_graphs`` bring them back."""
        self.kv_caches = []
        unbind_kv_caches(self.attention_layers)
        if self.drafter is not None:
            self.drafter.release_kv_cache()
        self.cuda_graphs = None

    @property
    def cuda_graphs_enabled(self) -> bool:
        """Graphs need CUDA and a backend with no host work per step (Triton); never on the CPU,
        nor with pipeline stages or LoRA (its token groups change per step)."""
        graphs = self.cfg.compilation.cudagraph and self.cfg.parallel.pp == 1 and not self.cfg.lora.enable_lora
        graphs = graphs and self.mrope is None  # (3, T) positions: no captured (T,) buffers for them
        return graphs and self.device.type == "cuda" and self.attn_backend.name == "triton"

    def capture_cuda_graphs(self) -> None:
        """Capture decode steps after the KV cache exists (no-op where graphs are off)."""
        if not self.cuda_graphs_enabled:
            return
        sizes = [s for s in self.cfg.compilation.cudagraph_capture_sizes if s <= self.cfg.scheduler.max_num_seqs]
        if not sizes:
            return
        max_len = min(self.cfg.max_model_len, self.cfg.compilation.max_seq_len_to_capture)
        self.cuda_graphs = CUDAGraphRunner(self.model, sizes, cdiv(max_len, self.block_size), max_len, self.device)
        self.cuda_graphs.capture()

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Replay a captured graph for decode-only steps that fit one; run eagerly otherwise
        (always with ``inputs_embeds``: a step holding image placeholders)."""
        if inputs_embeds is not None:
            return self.model(input_ids, positions, meta, inputs_embeds=inputs_embeds)
        graphs = self.cuda_graphs
        if graphs is not None and meta.max_query_len == 1 and graphs.covers(meta):
            return graphs.run(input_ids, positions, meta)
        if intermediate is not None:  # a later pipeline stage
            return self.model(input_ids, positions, meta, intermediate)
        return self.model(input_ids, positions, meta)

    # ---- one step -----------------------------------------------------------------
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(sched).result()

    @torch.inference_mode()
    def execute_model_async(self, sched: SchedulerOutput) -> PendingOutput | DoneOutput:
        """Launch the step; the result's ``result()`` waits for its sampled tokens."""
        self._update_states(sched)
        if sched.is_empty:
            return DoneOutput(ModelRunnerOutput())
        num_tokens = sched.total_num_scheduled_tokens
        rows, query_lens = self._scheduled_rows(sched, num_tokens)
        step = self._prepare_inputs(rows, query_lens, num_tokens)
        intermediate = self.pipeline.recv(len(step.input_ids)) if self.pipeline is not None else None
        embeds = None
        if self.mm is not None and self.mm.features:  # images: encode this step's, merge their rows
            self.mm.encode(sched)
            embeds = self.mm.inputs_embeds(step, self.batch)
        hidden = self._forward(step.input_ids, step.positions, step.meta, intermediate, embeds)  # (T, hidden)
        if self.pipeline is not None and not self.pipeline.is_last:  # hand on to the next stage; it samples
            self.pipeline.send(hidden)  # and the scheduler sends its tokens back with the next step
            return DoneOutput(ModelRunnerOutput())
        if self.pooler is not None:  # runner=pooling: pooled hidden states instead of sampled tokens
            return DoneOutput(self._pool(hidden, step, sched))
        prompt_logprobs = self._gather_prompt_logprobs(hidden, step) if self.prompt_logprobs else {}
        if not len(step.sample_idx):
            if self.drafter is not None:  # a prefill chunk: the draft's KV catches up
                self.drafter.propose(self.batch, step, hidden)
            return DoneOutput(ModelRunnerOutput())
        pending = self._sample_and_collect(hidden, step, prompt_logprobs, sched)
        if self.spec is not None:
            out = pending.result()
            self.batch.store_sampled()  # the verifier replaces the plain samples in the rows
            return DoneOutput(self._speculate(hidden, step, sched, out))
        return pending

    def _speculate(
        self, hidden: torch.Tensor, step: StepInputs, sched: SchedulerOutput, out: ModelRunnerOutput
    ) -> ModelRunnerOutput:
        """Verify this step's drafts; then a draft model proposes the next ones."""
        drafter = self.drafter
        if sched.scheduled_spec_decode_tokens:
            out = self.spec.verify(
                self.batch,
                step,
                sched,
                self.model.compute_logits,
                hidden,
                self.sampling.seeded_generator,
                out,
                drafter.draft_probs if drafter else None,
            )
        if drafter is not None:
            out.spec_token_ids = drafter.propose(self.batch, step, hidden)
        return out

    def _pool(self, hidden: torch.Tensor, step: StepInputs, sched: SchedulerOutput) -> ModelRunnerOutput:
        """The pooler's view of the step: per scheduled request its id, tokens computed before
        the step and new tokens; the requests whose prompt is now complete; those to forget."""
        req_ids = [self.batch.req_ids[r] for r in step.rows.tolist()]
        computed = self.batch.num_computed_tokens[step.rows].tolist()
        return self.pooler(
            hidden, req_ids, computed, step.query_lens.tolist(), step.sample_idx.tolist(), sched.forget_req_ids
        )

    def _update_states(self, sched: SchedulerOutput) -> None:
        """Bring the batch and the per-request stores up to date (``request_states.py``)."""
        update_states(
            sched,
            self.batch,
            self.device,
            self.prompt_logprobs,
            self.spec,
            self.pipeline,
            self.mm,
            self.lora,
            self.mrope,
        )

    def _scheduled_rows(self, sched: SchedulerOutput, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """(B,) batch rows with new tokens this step and (B,) their counts (``num_tokens`` in all)."""
        return self.rows_of(self.batch, sched.num_scheduled_tokens, num_tokens)

    def _prepare_inputs(self, rows: np.ndarray, query_lens: np.ndarray, num_tokens: int) -> StepInputs:
        prev = self.batch.prev_sampled  # async scheduling: the last step's ids, not stored yet
        index = self.batch.prev_sampled_index if prev is not None else None
        step = self.inputs.build(self.batch, rows, query_lens, index, num_tokens)
        if self.lora is not None:
            self.lora.prepare_step([self.batch.req_ids[r] for r in rows.tolist()], query_lens)
        step.meta.backend_data = self.attn_backend.prepare(step.meta, self.block_size)
        if self.mrope is not None:
            step.positions = self.mrope.positions(self.batch, step)  # (3, T)
        if step.placeholders is not None:
            dst, src = step.placeholders
            step.input_ids[dst] = prev.device[src]
        return step

    def _gather_prompt_logprobs(self, hidden: torch.Tensor, step: StepInputs) -> dict:
        return self.prompt_logprobs.gather(self.model.compute_logits, hidden, step, self.batch)

    def _sample_and_collect(
        self, hidden: torch.Tensor, step: StepInputs, prompt_logprobs: dict, sched: SchedulerOutput
    ) -> PendingOutput:
        rows = step.rows[step.sample_idx]  # ascending
        if rows[-1] == len(rows) - 1:  # rows 0 .. S-1, the common decode step
            req_ids = self.batch.req_ids[: len(rows)]
        else:
            req_ids = [self.batch.req_ids[r] for r in rows.tolist()]
        if len(rows) < len(step.input_ids):
            hidden = hidden[step.logits_index]
        # else every token is a request's last (decode only) and samples: hidden is in order
        logits = self.model.compute_logits(hidden)  # (S, vocab) fp32
        seq_lens = step.query_lens[step.sample_idx] + self.batch.num_computed_tokens[rows]
        meta = self.sampling.metadata(rows, seq_lens, logits.shape[-1])
        meta.grammar_bitmask = None
        if sched.grammar_bitmask is not None:
            meta.grammar_bitmask = bitmask_for_rows(
                sched.grammar_bitmask, sched.structured_output_request_ids, req_ids, self.device
            )
        sampled = self.sampler(logits, meta)
        broadcast_from_first(sampled.token_ids)  # every tp rank (of the last stage) keeps the same tokens
        tokens = self.batch.hold_sampled(req_ids, rows, sampled.token_ids)
        return PendingOutput(tokens, sampled, self.sampling.num_logprobs, prompt_logprobs)

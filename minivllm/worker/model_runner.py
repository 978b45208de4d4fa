"""The model runner: scheduler output in, sampled tokens out, on one device.

Per step (``execute_model_async``) it

1. brings the persistent batch (``input_batch.py``) up to date with the scheduler's deltas
   (``_update_states``): requests join and leave the batch, and with it every per-request
   store registered with it (prompt logprobs, images, M-RoPE positions, LoRA adapters, the
   verifier's drafted requests, the pooler's sums); rows are compacted, block tables grown in place;
2. computes the flat step inputs with numpy and sends them to the device in one copy
   (``step_inputs.py``);
3. runs the model;
4. samples for the requests whose known tokens are now all computed (a request mid-way
   through a chunked prefill samples nothing), with the sampling inputs the batch makes
   (``InputBatch.sampling_metadata``), and with speculative decoding verifies the drafts
   (``spec_decode/``).

With a KV connector (``kv_transfer``) a step whose scheduler output carries transfers loads
its blocks before all this and saves the blocks it computed after (``kv_transfer/connector.py``);
other steps pass one ``None`` check.

The batch holds the sampled ids (``InputBatch.hold_sampled``); they come back to the host
in the step's one synchronization (``PendingOutput.result``), which with async scheduling
happens after the next step is already launched: the next step then reads those tokens
from the device (its *placeholders*). The batch stores them in its rows at the start of
the first step after they were read.

Before the KV cache exists the worker measures a start-up profile (``prepare_profile``,
``profile_run``: one step at its widest on throw-away inputs, made by ``profile.py``).
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
from torch import nn

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.ops.checks import check_fp8_kv_capability
from minivllm.attention.ops.paged_attention_tiles import default_num_splits
from minivllm.config.device import capture_sizes
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import NewRequestData, SchedulerOutput
from minivllm.distributed.parallel_state import broadcast_from_first
from minivllm.distributed.pipeline import IntermediateTensors, PipelineStage, pipeline_stage
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.kv_transfer import make_kv_connector
from minivllm.kv_transfer.connector import KVConnector
from minivllm.layers.attention import attention_layers, state_layers
from minivllm.layers.mla import MLAAttention
from minivllm.layers.rotary import share_cos_sin_caches
from minivllm.lora.manager import LoRAModelManager
from minivllm.models.interfaces import supports_mrope, supports_multimodal
from minivllm.models.llama_cpu_decode import attach as attach_cpu_decode
from minivllm.models.utils import compile_small_ops, pack_cpu_weights
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.outputs import DoneOutput, KVConnectorOutput, ModelRunnerOutput, PositionLogprobs, StepResult
from minivllm.pooling.pooler import Pooler
from minivllm.request import RequestId
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler, SamplerOutput
from minivllm.structured_output.backend import bitmask_for_rows
from minivllm.tuned_tiles import device_facts
from minivllm.utils import cache_dir, cdiv, instantiate_target
from minivllm.worker.cuda_graphs import CUDAGraphRunner
from minivllm.worker.input_batch import InputBatch, SampledTokens, record_event, to_host
from minivllm.worker.mm_runner import MRopePositions, MultiModalRunner
from minivllm.worker.profile import (
    encoder_cache_bytes,
    forward_batch,
    held_draft_probs,
    mla_workspace_bytes,
    profile_images,
    profile_params,
    sampler_rows,
    sampling_batch,
    verify_params,
    verify_rows,
)
from minivllm.worker.prompt_logprobs import PromptLogprobsRequests
from minivllm.worker.spec_decode.eagle import model_proposer
from minivllm.worker.spec_decode.verifier import DraftVerifier
from minivllm.worker.step_inputs import StepInputBuilder, StepInputs

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: VllmConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.block_size = cfg.cache.block_size
        self.model: nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.state_layers: list[nn.Module] = []
        """Hybrid models' linear-attention layers (``layers.attention.state_layers``; set in ``load_model``)."""
        self.cuda_graphs: CUDAGraphRunner | None = None
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(cfg.model.seed), fused=cfg.fused_sampler)
        self.pooler = Pooler(cfg.model.pooler_config.pooling_type) if cfg.model.runner == "pooling" else None
        max_reqs, max_blocks = cfg.scheduler.max_num_seqs, cdiv(cfg.max_model_len, self.block_size)
        self.batch = InputBatch(max_reqs, cfg.max_model_len, max_blocks, device)
        self.inputs = StepInputBuilder(
            cfg.scheduler.max_num_batched_tokens, max_reqs, max_blocks, self.block_size, device
        )
        self.prompt_logprobs = PromptLogprobsRequests()
        spec = cfg.speculative
        self.spec = DraftVerifier(self.sampler, self.block_size, device) if spec.enabled else None
        """Speculative decoding: drafts into the batch, verified tokens out; None when off."""
        self.drafter = model_proposer(cfg, self.sampler, device) if spec.uses_model else None
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
        self.kv_connector: KVConnector | None = None
        """The KV connector's worker half (``kv_transfer``; set in ``init_kv_connector``); None when off."""
        self.state_slots: StateSlots | None = None
        """Hybrid models: each running request's slot in the linear-attention layers' states (set in
        ``load_model``); None for a model without such layers."""

    # ---- set-up -------------------------------------------------------------------
    def load_model(self) -> None:
        self.attn_backend = instantiate_target(self.cfg.attention.backend)
        self._check_kv_cache_dtype()
        loader = instantiate_target(self.cfg.load.loader)
        self.model = loader.load_model(self.cfg, self.attn_backend, self.device)
        if self.cfg.cpu_packed_linear:  # oneDNN's matmul on weights reordered once (device.cpu_packed_linear)
            pack_cpu_weights(self.model, self.cfg.cpu_pack_min_weights)
        share_cos_sin_caches(self.model, self.cfg.max_model_len, self.device)
        if self.cfg.torch_compile:  # inductor's compiled kernels kept across runs, under minivllm's cache
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir("inductor")))
            compile_small_ops(self.model)
        self.attention_layers = attention_layers(self.model)
        self.state_layers = state_layers(self.model)
        if self.state_layers:
            self.state_slots = StateSlots(self.cfg.scheduler.max_num_seqs)
        if supports_multimodal(self.model):
            self.mm = MultiModalRunner(self.model, self.device)
        self.pipeline = pipeline_stage(self.cfg, self.model, self.device)  # None unless parallel.pp > 1
        if self.cfg.cpu_fused_decode:  # a Llama stack's decode steps as one C call each
            attach_cpu_decode(self.model, self.cfg.device.cpu_fused_decode)
        if self.cfg.lora.enable_lora:
            self.lora = LoRAModelManager(self.model, self.cfg.lora, self.cfg.hf_config, self.cfg.dtype, self.device)
        if self.drafter is not None:
            self.drafter.load_model(self.attn_backend, self.model)
        if supports_mrope(self.model):
            self._check_mrope()
            self.mrope = MRopePositions(self.model, self.device)
        self._register_request_stores()

    def _register_request_stores(self) -> None:
        """Every per-request store follows the batch's membership (``InputBatch.register``).
        Prompt logprobs are tracked only where they are computed: with pipeline stages, on the last one."""
        lora = _AdapterRequests(self.lora) if self.lora is not None else None
        last_stage = self.pipeline is None or self.pipeline.is_last
        stores = (self.mm, lora, self.mrope, self.spec, self.pooler, self.state_slots)
        for store in (*stores, self.prompt_logprobs if last_stage else None):
            if store is not None:
                self.batch.register(store)

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

    # ---- the KV cache: one (2, num_blocks, block_size, kv_heads, head_dim) tensor per attention layer ----
    # (an MLA layer's is (num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim): layers/mla.py)
    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return self.attention_layers[0].kv_cache_shape(num_blocks, self.block_size)

    def kv_cache_bytes_per_block(self) -> int:
        draft = self.drafter.kv_cache_bytes_per_block() if self.drafter is not None else 0
        return self.kv_bytes_per_block() + draft

    def kv_bytes_per_block(self) -> int:
        """One block over the model's attention layers (a draft's aside): what a KV connector moves."""
        per_layer = int(np.prod(self.kv_cache_shape(1)))
        return per_layer * len(self.attention_layers) * self.cfg.kv_cache_dtype.itemsize

    def state_bytes_per_slot(self) -> int:
        """One request's states over the model's linear-attention layers (0 without any): the
        conv state (channels x (K - 1), model dtype) and the recurrent state (heads x Dk x Dv, fp32)."""
        return sum(
            int(np.prod(shape[1:])) * dtype.itemsize
            for layer in self.state_layers
            for shape, dtype in layer.state_shapes(1, self.cfg.dtype)
        )

    def num_state_slots(self) -> int:
        """State slots allocated beside the KV blocks: one per request that can run at once."""
        return self.state_slots.num_slots if self.state_slots is not None else 0

    def init_kv_connector(self) -> None:
        """The KV connector's worker half, bound to the KV cache (no-op without ``kv_transfer``).
        Not in ``init_kv_cache``: the memory profile allocates a cache too."""
        if not self.cfg.kv_transfer.enabled:
            return
        num_blocks = self.kv_caches[0].shape[self._kv_block_dim()]
        spec = KVCacheSpec(self.block_size, num_blocks, None, self.kv_bytes_per_block())
        self.kv_connector = make_kv_connector(self.cfg, "worker", spec)
        self.kv_connector.register_kv_caches(self.kv_caches, self._kv_block_dim())

    def _kv_block_dim(self) -> int:
        """The dimension of a layer's KV cache that counts blocks."""
        one, two = self.kv_cache_shape(1), self.kv_cache_shape(2)
        return next(d for d in range(len(one)) if one[d] != two[d])

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate one zeroed tensor per layer and bind it to the layer (``Attention.kv_cache``),
        which writes and reads it."""
        shape = self.kv_cache_shape(num_blocks)
        self.kv_caches = []
        for layer in self.attention_layers:
            layer.kv_cache = torch.zeros(shape, dtype=self.cfg.kv_cache_dtype, device=self.device)
            self.kv_caches.append(layer.kv_cache)
        for layer in self.state_layers:  # zeroed: a slot's first chunk reads none of it
            num_slots, dtype = self.num_state_slots(), self.cfg.dtype
            layer.bind_states(
                *(torch.zeros(s, dtype=d, device=self.device) for s, d in layer.state_shapes(num_slots, dtype))
            )
        if self.drafter is not None:  # its own tensors over the same block ids
            self.drafter.init_kv_cache(num_blocks)
        if self.kv_connector is not None:  # woken from sleep mode: new tensors
            self.kv_connector.register_kv_caches(self.kv_caches, self._kv_block_dim())

    def release_kv_cache(self) -> None:
        """Drop the KV cache and the CUDA graphs that read it (sleep mode: the memory goes back);
        ``init_kv_cache`` and ``capture_cuda_graphs`` bring them back."""
        self.kv_caches = []
        for layer in self.attention_layers:
            layer.kv_cache = None
        for layer in self.state_layers:
            layer.bind_states(None, None)
        if self.drafter is not None:
            self.drafter.release_kv_cache()
        if self.kv_connector is not None:  # its views would keep the memory
            self.kv_connector.release_kv_caches()
        self.cuda_graphs = None

    # ---- CUDA graphs --------------------------------------------------------------
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
        sizes = capture_sizes(self.cfg.compilation.cudagraph_capture_sizes, self.cfg.scheduler.max_num_seqs)
        if not sizes:
            return
        max_len = min(self.cfg.max_model_len, self.cfg.compilation.max_seq_len_to_capture)
        # The fused sampler joins the graphs where a decode step's tokens come from the last rank's
        # logits alone (no pooler, drafts, pipeline stages or images).
        samples = self.sampler.fused and self.pooler is None and self.spec is None and self.mm is None
        logits = self.model.compute_logits if samples and self.pipeline is None else None
        self.cuda_graphs = CUDAGraphRunner(
            self.model,
            sizes,
            cdiv(max_len, self.block_size),
            max_len,
            self.device,
            self._split_sizes(sizes, max_len),
            compute_logits=logits,
            states=bool(self.state_layers),
        )
        self.cuda_graphs.capture()
        graphs = self.cuda_graphs
        logger.info(
            "Captured %d CUDA graphs (batch sizes %d..%d) in %.2f s, %.1f MiB of graph memory",
            len(graphs.sizes) + len(graphs.short_sizes),
            graphs.sizes[0],
            graphs.sizes[-1],
            graphs.capture_s,
            graphs.memory_bytes / 2**20,
        )

    def _split_sizes(self, sizes: list[int], max_len: int) -> list[int]:
        """The captured batch sizes whose decode attention splits the keys at ``max_len`` (the
        graphs' context): they also get a short-context graph with one launch a layer. None for
        MLA: its decode kernel never splits the keys, whatever the context."""
        if not self.attention_layers or any(isinstance(a, MLAAttention) for a in self.attention_layers):
            return []
        num_sms = device_facts(self.device).num_sms  # what the attention wrapper decides with
        kv_heads = min(layer.num_kv_heads for layer in self.attention_layers)
        return [n for n in sizes if default_num_splits(num_sms, n * kv_heads, 1, max_len) > 1]

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
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    @torch.inference_mode()
    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepResult:
        """Launch the step; the result's ``result()`` waits for its sampled tokens. A step with
        KV-connector transfers loads its blocks before it runs and saves them after."""
        meta = scheduler_output.kv_connector_metadata
        if meta is None:
            return self._execute(scheduler_output)
        self.kv_connector.start_load_kv(meta)
        launched = self._execute(scheduler_output)
        self.kv_connector.save_kv(meta)
        return _ConnectorStep(launched, self.kv_connector.get_finished(meta))

    def _execute(self, scheduler_output: SchedulerOutput) -> PendingOutput | DoneOutput:
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            return DoneOutput(ModelRunnerOutput())
        step = self._prepare_inputs(scheduler_output)
        intermediate = self.pipeline.recv(len(step.input_ids)) if self.pipeline is not None else None
        embeds = None
        if self.mm is not None and self.mm.features:  # images: encode this step's, merge their rows
            self.mm.encode(scheduler_output)
            embeds = self.mm.inputs_embeds(step, self.batch)
        meta = None
        if intermediate is None and embeds is None and self.pooler is None and self.spec is None:
            sampled, meta = self._sample_in_graph(step, scheduler_output)
            if sampled is not None:
                return self._hold(step, scheduler_output, sampled, meta, {})
        hidden = self._forward(step.input_ids, step.positions, step.meta, intermediate, embeds)  # (T, hidden)
        if self.pipeline is not None and not self.pipeline.is_last:  # hand on to the next stage; it samples
            self.pipeline.send(hidden)  # and the scheduler sends its tokens back with the next step
            return DoneOutput(ModelRunnerOutput())
        if self.pooler is not None:  # runner=pooling: pooled hidden states instead of sampled tokens
            return DoneOutput(self._pool(hidden, step))
        prompt_logprobs = {}
        if self.prompt_logprobs:
            prompt_logprobs = self.prompt_logprobs.gather(self.model.compute_logits, hidden, step, self.batch)
        if not len(step.sample_idx):
            if self.drafter is not None:  # a prefill chunk: the draft's KV catches up
                self.drafter.propose(self.batch, step, hidden)
            return DoneOutput(ModelRunnerOutput())
        sampled, meta = self._sample(hidden, step, scheduler_output, meta)
        pending = self._hold(step, scheduler_output, sampled, meta, prompt_logprobs)
        if self.spec is not None:
            out = pending.result()
            self.batch.store_sampled()  # the verifier replaces the plain samples in the rows
            return DoneOutput(self._speculate(hidden, step, scheduler_output, out))
        return pending

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Fold the scheduler's per-request deltas into the batch (and so into every registered
        store), before any input is built. In order:

        1. Sampled tokens of earlier steps are stored in their rows while every row still
           holds the request that sampled them.
        2. Encoder outputs no request needs any more are dropped.
        3. ``forget_req_ids`` (finished, aborted or preempted) leave before ``new_reqs`` enter:
           a preempted request comes back as a new one, in full, under the same id.
        4. Requests already in the batch lose the block-table entries of rolled-back drafts,
           then take the scheduler's computed-token counts and new blocks (and, on a pipeline
           stage other than the last, the tokens the last stage sampled).
        5. The batch is condensed (rows ``0 .. N-1`` full), and only then are this step's
           draft tokens written, into the rows the step will read.
        """
        batch = self.batch
        batch.store_sampled()  # the tokens of earlier steps whose outputs were taken
        if self.mm is not None and scheduler_output.free_encoder_input_ids:
            self.mm.free(scheduler_output.free_encoder_input_ids)
        for req_id in scheduler_output.forget_req_ids:
            batch.remove(req_id)
        for new in scheduler_output.new_reqs:
            batch.add(new)
        cached = scheduler_output.cached_reqs
        if len(cached):
            if self.spec is not None:
                self.spec.roll_back_block_tables(batch, cached)
            batch.update_cached(cached, sampled_elsewhere=self.pipeline is not None and not self.pipeline.is_last)
        batch.condense()
        if scheduler_output.scheduled_spec_decode_tokens:
            self.spec.write_drafts(batch, scheduler_output)

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> StepInputs:
        """The step's inputs on the device: the scheduled rows' tokens, positions and attention
        metadata (and the LoRA mapping, M-RoPE positions and async placeholders where on)."""
        num_tokens = scheduler_output.total_num_scheduled_tokens
        rows, query_lens = self.batch.scheduled_rows(scheduler_output.num_scheduled_tokens, num_tokens)
        prev = self.batch.prev_sampled  # async scheduling: the last step's ids, not stored yet
        index = self.batch.prev_sampled_index if prev is not None else None
        slots = self.state_slots.of(self.batch, rows) if self.state_slots is not None else None
        step = self.inputs.build(self.batch, rows, query_lens, index, num_tokens, slots)
        if self.lora is not None:
            self.lora.prepare_step([self.batch.req_ids[r] for r in rows.tolist()], query_lens)
        step.meta.backend_data = self.attn_backend.prepare(step.meta, self.block_size)
        if self.mrope is not None:
            step.positions = self.mrope.positions(self.batch, step)  # (3, T)
        if step.placeholders is not None:
            dst, src = step.placeholders
            step.input_ids[dst] = prev.device[src]
        return step

    def _sample_in_graph(
        self, step: StepInputs, scheduler_output: SchedulerOutput
    ) -> tuple[SamplerOutput | None, SamplingMetadata | None]:
        """A decode step whose tokens the captured graphs sample (``CUDAGraphRunner.run_sampled``:
        the model and the fused sampler in one replay): every row samples, and none asks for logit
        edits, a grammar, logprobs or min-p / top-k / top-p; then its tokens and sampling metadata.
        Otherwise (None, the step's sampling metadata when it was built, for ``_sample`` to reuse)."""
        graphs = self.cuda_graphs
        if graphs is None or graphs.vocab_size is None or step.meta.max_query_len != 1 or not graphs.covers(step.meta):
            return None, None
        if scheduler_output.grammar_bitmask is not None or self.prompt_logprobs:
            return None, None
        rows = step.rows[step.sample_idx]
        if len(rows) != len(step.input_ids):
            return None, None
        meta = self.batch.sampling_metadata(rows, step.meta.seq_lens_cpu[step.sample_idx], graphs.vocab_size)
        if meta.edits is not None or meta.max_num_logprobs is not None or meta.truncated_rows is not None:
            return None, meta
        seeds, offsets = self.sampler.philox_inputs(meta, len(rows), self.device)
        tokens = graphs.run_sampled(step.input_ids, step.positions, step.meta, meta.temperature, seeds, offsets)
        tokens = tokens.clone()  # the next replay overwrites the static output
        broadcast_from_first(tokens)
        return SamplerOutput(tokens, None, None, None), meta

    def _req_ids(self, rows: np.ndarray) -> list[RequestId]:
        if rows[-1] == len(rows) - 1:  # rows 0 .. S-1, the common decode step
            return self.batch.req_ids[: len(rows)]
        return [self.batch.req_ids[r] for r in rows.tolist()]

    def _sample(
        self,
        hidden: torch.Tensor,
        step: StepInputs,
        scheduler_output: SchedulerOutput,
        meta: SamplingMetadata | None = None,
    ) -> tuple[SamplerOutput, SamplingMetadata]:
        """The step's sampled tokens and the sampling metadata they came from (``meta``: the
        step's when ``_sample_in_graph`` built it already)."""
        rows = step.rows[step.sample_idx]  # ascending
        if len(rows) < len(step.input_ids):
            hidden = hidden[step.logits_index]
        # else every token is a request's last (decode only) and samples: hidden is in order
        logits = self.model.compute_logits(hidden)  # (S, vocab) fp32
        if meta is None:
            meta = self.batch.sampling_metadata(rows, step.meta.seq_lens_cpu[step.sample_idx], logits.shape[-1])
        meta.grammar_bitmask = None
        if scheduler_output.grammar_bitmask is not None:
            meta.grammar_bitmask = bitmask_for_rows(
                scheduler_output.grammar_bitmask,
                scheduler_output.structured_output_request_ids,
                self._req_ids(rows),
                self.device,
            )
        sampled = self.sampler(logits, meta)
        broadcast_from_first(sampled.token_ids)  # every tp rank (of the last stage) keeps the same tokens
        return sampled, meta

    def _hold(
        self,
        step: StepInputs,
        scheduler_output: SchedulerOutput,
        sampled: SamplerOutput,
        meta: SamplingMetadata,
        prompt_logprobs: dict,
    ) -> PendingOutput:
        """The step's output on its way to the host, its ids held by the batch
        (``InputBatch.hold_sampled``). A batch of several decode steps runs its later steps here,
        before the ids are held (``_decode_steps``), and all their ids travel as one (S, n)."""
        rows = step.rows[step.sample_idx]
        if scheduler_output.num_steps > 1:
            sampled = self._decode_steps(step, scheduler_output, sampled)
        held = self.batch.hold_sampled(self._req_ids(rows), rows, sampled.token_ids)
        return PendingOutput(held, sampled, meta.num_logprobs, prompt_logprobs)

    def _decode_steps(self, step: StepInputs, scheduler_output: SchedulerOutput, first: SamplerOutput) -> SamplerOutput:
        """The batch's ``n = num_steps`` decode steps' samples, ``first`` the first step's: (S, n)
        token ids, and (S, n, 1 + k) logprobs where asked. Each later step is the last one moved on
        by a position on the device (``StepInputs.advance``), so nothing reaches the host in
        between: no scheduling, no synchronization, no output; a captured graph replays it where
        one covers it. The scheduler sends such a batch only when every row decodes and samples
        without reading its token history or a grammar (``may_run_ahead``)."""
        steps = [first]
        for _ in range(scheduler_output.num_steps - 1):
            step.advance(steps[-1].token_ids, self.block_size)
            step.meta.backend_data = self.attn_backend.prepare(step.meta, self.block_size)
            sampled, meta = self._sample_in_graph(step, scheduler_output)
            if sampled is None:
                hidden = self._forward(step.input_ids, step.positions, step.meta)
                sampled, _ = self._sample(hidden, step, scheduler_output, meta)
            steps.append(sampled)
        tokens = torch.stack([s.token_ids for s in steps], dim=1)
        if first.logprobs is None:
            return SamplerOutput(tokens, None, None, None)
        fields = ("logprobs", "logprob_token_ids", "logprob_ranks")
        return SamplerOutput(tokens, *(torch.stack([getattr(s, f) for s in steps], dim=1) for f in fields))

    def _speculate(
        self, hidden: torch.Tensor, step: StepInputs, scheduler_output: SchedulerOutput, out: ModelRunnerOutput
    ) -> ModelRunnerOutput:
        """Verify this step's drafts; then a draft model proposes the next ones."""
        drafter = self.drafter
        if scheduler_output.scheduled_spec_decode_tokens:
            draft_probs = drafter.draft_probs if drafter else None
            out = self.spec.verify(
                self.batch, step, scheduler_output, self.model.compute_logits, hidden, out, draft_probs
            )
        if drafter is not None:
            out.spec_token_ids = drafter.propose(self.batch, step, hidden)
        return out

    def _pool(self, hidden: torch.Tensor, step: StepInputs) -> ModelRunnerOutput:
        """The pooler's view of the step: per scheduled request its id, tokens computed before
        the step and new tokens; the requests whose prompt is now complete."""
        req_ids = [self.batch.req_ids[r] for r in step.rows.tolist()]
        computed = self.batch.num_computed_tokens[step.rows].tolist()
        return self.pooler(hidden, req_ids, computed, step.query_lens.tolist(), step.sample_idx.tolist())

    # ---- the start-up profile (profile.py) -----------------------------------------
    def encoder_cache_bytes(self) -> int:
        """Memory a full encoder cache holds, which the profile's peak leaves out (0 for text)."""
        return encoder_cache_bytes(self.cfg) if self.mm is not None else 0

    def mla_workspace_bytes(self) -> int:
        """Memory an MLA prefill's earlier context takes beside the profile's peak (0 without MLA layers)."""
        layer = next((a for a in self.attention_layers if isinstance(a, MLAAttention)), None)
        if layer is None:
            return 0
        return mla_workspace_bytes(self.cfg, layer.num_heads, layer.qk_nope_head_dim, layer.v_head_dim, layer.head_dim)

    def prepare_profile(self) -> None:
        """What ``profile_run`` needs built before the caller starts measuring: for a model that
        takes images, the dummy images through the checkpoint's processor (its loading and imports
        are no part of a step's peak). Nothing for a text-only model."""
        if self.mm is not None:
            self.profile_images = profile_images(self.cfg, self.model)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """The vision encoder on one step's largest input (models that take images, from
        ``prepare_profile``), then a forward pass at the full token budget on a throw-away
        cache and batch, then the sampler and the verifier at their widest steps, so the caller
        can measure peak activation memory (``profile.py``)."""
        start = time.perf_counter()
        if self.mm is not None:
            images = self.profile_images if self.profile_images is not None else profile_images(self.cfg, self.model)
            self.profile_images = None
            outputs = self.mm.run_encoder(images)
            del outputs, images  # a step's encoder outputs go to the cache, which is reserved whole
        if self.drafter is not None:  # the draft distributions it holds between steps, held throughout
            self.drafter.draft_probs = held_draft_probs(self.cfg, self.device)
        batch, lens, num_blocks = forward_batch(self.cfg, self.device)
        self.init_kv_cache(num_blocks)
        step = self.inputs.build(batch, np.arange(len(lens)), lens)
        step.meta.backend_data = self.attn_backend.prepare(step.meta, self.block_size)
        if self.state_slots is not None:  # slots 0 .. B-1, each from zeros
            step.meta.state_indices = torch.arange(len(lens), dtype=torch.int32, device=self.device)
            step.meta.has_initial_state = torch.zeros(len(lens), dtype=torch.bool, device=self.device)
        intermediate = self.pipeline.empty(int(lens.sum())) if self.pipeline and not self.pipeline.is_first else None
        hidden = self._forward(step.input_ids, step.positions, step.meta, intermediate)
        if self.pipeline is None or self.pipeline.is_last:
            last = hidden[step.logits_index]  # (B, hidden)
            self.model.compute_logits(last)
            if self.pooler is None:  # a pooling runner samples nothing
                self._profile_sampler(last[-1:])
        if self.drafter is not None:
            self.drafter.catch_up(step)
        self.release_kv_cache()
        if self.drafter is not None:
            self.drafter.draft_probs = {}
        if self.cfg.torch_compile:
            logger.info("Profile run with torch.compile of the small ops: %.1f s", time.perf_counter() - start)

    def _profile_sampler(self, row: torch.Tensor) -> None:
        """The sampler at its widest step, from copies of one (1, hidden) row, for requests
        asking for every option that allocates; then the verifier's widest step with
        speculative decoding. Both take their metadata the way a step does."""
        num_rows = sampler_rows(self.cfg)
        logits = self.model.compute_logits(row.expand(num_rows, -1))  # (S, vocab) fp32
        vocab_size = logits.shape[-1]
        batch = sampling_batch(num_rows, profile_params(self.cfg, vocab_size), self.device)
        rows = np.arange(num_rows)
        self.sampler(logits, batch.sampling_metadata(rows, batch.num_tokens[rows], vocab_size))
        del logits
        if self.spec is not None:
            k = self.cfg.speculative.num_speculative_tokens
            num_rows = verify_rows(self.cfg)
            logits = self.model.compute_logits(row.expand(num_rows, -1))  # (N, vocab) fp32
            batch = sampling_batch(cdiv(num_rows, k + 1), verify_params(), self.device)
            meta = batch.sampling.metadata(np.arange(num_rows) // (k + 1))  # k + 1 positions per request
            self.spec.profile(logits, meta, k, self.drafter is not None)


class _AdapterRequests:
    """The LoRA manager as a request store of the batch: each request's adapter, by id."""

    def __init__(self, manager: LoRAModelManager) -> None:
        self.manager = manager

    def add(self, new: NewRequestData) -> None:
        self.manager.add_request(new.req_id, new.lora_request)

    def remove(self, req_id: RequestId) -> None:
        self.manager.remove_request(req_id)


class StateSlots:
    """Hybrid models: the slot of the linear-attention layers' state tensors each request in the
    batch owns, as the KV-cache manager assigned it (``NewRequestData.state_slot``: taken at
    admission, freed when the request finishes or is preempted; a preempted request comes back
    as a new one and recomputes). A slot's contents are never cleared: a request's first step
    reads zeros instead (``has_initial_state`` False while it has no computed tokens)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slot_of: dict[RequestId, int] = {}

    def add(self, new: NewRequestData) -> None:
        if new.state_slot is None or not 0 <= new.state_slot < self.num_slots:
            raise RuntimeError(f"request {new.req_id}: state slot {new.state_slot} is not one of {self.num_slots}")
        self.slot_of[new.req_id] = new.state_slot

    def remove(self, req_id: RequestId) -> None:
        self.slot_of.pop(req_id, None)

    def of(self, batch: InputBatch, rows: np.ndarray) -> np.ndarray:
        """(B,) int32 the slots of the step's ``rows``, in step order (they reach the device with the
        step's other inputs, ``StepInputBuilder.build``: ``AttentionMetadata.state_indices``)."""
        return np.fromiter((self.slot_of[batch.req_ids[r]] for r in rows.tolist()), dtype=np.int32, count=len(rows))


class _ConnectorStep:
    """A launched step whose output carries its KV connector's finished transfers."""

    def __init__(self, launched: StepResult, finished: KVConnectorOutput) -> None:
        self.launched = launched
        self.finished = finished

    @property
    def resolved(self) -> bool:
        return self.launched.resolved

    def result(self) -> ModelRunnerOutput:
        out = self.launched.result()
        out.kv_connector_output = self.finished
        return out


class PendingOutput:
    """A step's output on its way from the device to the host.

    ``result()`` is the step's one synchronization: it reads the sampled ids (the
    batch's ``SampledTokens``, whose copy started when the step sampled) and the
    logprobs when asked, and turns them into a ``ModelRunnerOutput``. The batch
    stores the ids in its rows itself once they are read, so the runner knows every
    token it sampled without the scheduler sending them back. With async
    scheduling the engine calls it only after launching the next step; a
    synchronous step calls it at once. It is idempotent.
    """

    def __init__(
        self,
        tokens: SampledTokens,
        sampled: SamplerOutput,
        num_logprobs: list[int | None],
        prompt_logprobs: dict[RequestId, list[PositionLogprobs | None]],
    ) -> None:
        """``tokens``: the step's sampled ids as the batch holds them (``InputBatch.hold_sampled``);
        ``sampled``: the sampler's output they came from, row by row of ``tokens.req_ids``;
        ``num_logprobs``: each request's ``logprobs``."""
        self.tokens = tokens
        self.req_ids = tokens.req_ids
        self._num_logprobs = num_logprobs
        self._prompt_logprobs = prompt_logprobs
        self._logprobs_host = None
        self._logprobs_copied = None
        if sampled.logprobs is not None:
            logprobs = (sampled.logprobs, sampled.logprob_token_ids, sampled.logprob_ranks)
            self._logprobs_host = [to_host(t) for t in logprobs]
            self._logprobs_copied = record_event(sampled.logprobs.device)
        self._output: ModelRunnerOutput | None = None

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def result(self) -> ModelRunnerOutput:
        if self._output is not None:
            return self._output
        tokens = self.tokens.read()  # (S,), or (S, n) for n decode steps
        ids = tokens.tolist()
        out = ModelRunnerOutput(
            sampled_token_ids=dict(zip(self.req_ids, ids))
            if tokens.ndim == 2
            else {r: [t] for r, t in zip(self.req_ids, ids)},
            prompt_logprobs=self._prompt_logprobs,
        )
        if self._logprobs_host is not None:
            if self._logprobs_copied is not None:
                self._logprobs_copied.synchronize()
            values, ids, ranks = (t.tolist() for t in self._logprobs_host)
            if tokens.ndim == 1:  # one step: a position per row
                values, ids, ranks = ([row] for row in values), ([row] for row in ids), ([row] for row in ranks)
            for req_id, asked, row_values, row_ids, row_ranks in zip(
                self.req_ids, self._num_logprobs, values, ids, ranks
            ):
                if asked is not None:
                    out.logprobs[req_id] = [
                        PositionLogprobs(dict(zip(i[: 1 + asked], v[: 1 + asked])), r)
                        for v, i, r in zip(row_values, row_ids, row_ranks)
                    ]
        self._output = out
        return out

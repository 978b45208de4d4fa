"""The worker's half of multimodal inputs: run the vision encoder, keep its outputs,
and merge them into the step's input embeddings.

The scheduler decides which images are encoded in a step
(``SchedulerOutput.scheduled_encoder_inputs``, see ``core/encoder_scheduling.py``)
and when their outputs may go (``free_encoder_input_ids``, or the request being
forgotten). Per step this runs the scheduled encoder inputs
(``model.embed_multimodal``: the step's images in as few calls as the model allows,
``multimodal/feature.py``), then, when some scheduled
token is an image placeholder, embeds the step's token ids
(``model.embed_input_ids``) and writes each image's rows over its placeholders:
the slice of the image that this step's chunk covers. The model then runs on
``inputs_embeds``; such steps run eagerly (no CUDA graph). A step without
placeholder tokens passes None. A request leaves ``features`` once its chunk
passed its last image (a preempted request comes back in full), so once every
running request is past its images the runner skips all of this.

M-RoPE models (Qwen2-VL, ``SupportsMRoPE``) need (3, T) positions per step
(``MRopePositions``). A request's prompt positions are computed once, when it joins
the batch (``model.get_mrope_input_positions``), and kept by request id with its
delta; a step reads the slice its tokens need, so a chunked prefill that splits an
image's placeholders gets the same positions as one that does not. Every other
token (generated, or a prompt without images) sits at its 1-D position p plus the
request's delta (0 without images) in all three rows::

    step tokens  [ r0 prompt 4..7 | r1 decode p=30 ]
    positions    [ prompt[:, 4:8] | 30 + delta(r1) ]   (3, T)

``ModelRunner._prepare_inputs`` is where they replace the (T,) positions. Both
classes are request stores of the batch (``InputBatch.register``), and only a model
that takes images (or M-RoPE positions) builds them: text-only models pay nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.core.scheduler_output import NewRequestData, SchedulerOutput
from minivllm.models.interfaces import batches_multimodal
from minivllm.multimodal.feature import MultiModalFeature, encoder_batches, joined_data
from minivllm.request import RequestId
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs


class MultiModalRunner:
    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.features: dict[RequestId, list[MultiModalFeature]] = {}
        """The images of each request whose placeholders are not all computed yet."""
        self.encoder_cache: dict[str, torch.Tensor] = {}
        """Image identifier -> (length, hidden) encoder output on the device, shared by the
        requests holding the same image; the scheduler says when to drop one."""
        self.batched = batches_multimodal(model)
        """Whether one ``embed_multimodal`` call may take several images."""
        self.num_encoded = 0
        """Images of requests encoded since start-up (tests and the benchmark read it)."""
        self.num_encoder_calls = 0
        """``embed_multimodal`` calls since start-up, the memory profile's included."""

    # ---- requests in and out ----------------------------------------------------------
    def add(self, new: NewRequestData) -> None:
        if new.mm_features:
            self.features[new.req_id] = new.mm_features

    def remove(self, req_id: RequestId) -> None:
        self.features.pop(req_id, None)  # its cached outputs go when the scheduler frees them

    def free(self, identifiers: list[str]) -> None:
        for identifier in identifiers:
            self.encoder_cache.pop(identifier, None)

    # ---- one step -------------------------------------------------------------------------
    def encode(self, scheduler_output: SchedulerOutput) -> None:
        """Run the vision encoder on this step's scheduled images."""
        scheduled = [
            self.features[req_id][index]
            for req_id, indices in scheduler_output.scheduled_encoder_inputs.items()
            for index in indices
        ]
        for feature, out in zip(scheduled, self.run_encoder(scheduled)):
            self.encoder_cache[feature.identifier] = out
        self.num_encoded += len(scheduled)

    def run_encoder(self, features: list[MultiModalFeature]) -> list[torch.Tensor]:
        """Each image's (length, hidden) embeddings, in order. Images that join along dim 0
        go through one call; its rows are split per image and copied, so that freeing one
        image's cache entry frees its memory (a view would hold the whole call's output)."""
        outs: list[torch.Tensor] = [torch.empty(0)] * len(features)
        for group in encoder_batches(features, self.batched):
            items = [features[i] for i in group]
            data = {k: v.to(self.device) for k, v in joined_data(items).items()}
            rows = self.model.embed_multimodal(**data)  # (sum of lengths, hidden)
            self.num_encoder_calls += 1
            lengths = [f.length for f in items]
            if rows.shape[0] != sum(lengths):
                names = ", ".join(f.identifier[:12] for f in items[:4]) + (", ..." if len(items) > 4 else "")
                raise RuntimeError(
                    f"images {names}: the encoder gave {rows.shape[0]} rows for {sum(lengths)} placeholder tokens"
                )
            pieces = [rows] if len(items) == 1 else [p.clone() for p in rows.split(lengths)]
            for i, piece in zip(group, pieces):
                outs[i] = piece
        return outs

    def inputs_embeds(self, step: StepInputs, batch: InputBatch) -> torch.Tensor | None:
        """(T, hidden) input embeddings with the image rows merged in; None when no scheduled
        token of this step is an image placeholder (the model embeds the ids itself)."""
        merges, passed = [], []
        starts = step.query_start
        for i, row in enumerate(step.rows.tolist()):
            req_id = batch.req_ids[row]
            features = self.features.get(req_id)
            if not features:
                continue
            flat = int(starts[i])
            start = int(step.token_positions[flat])  # the chunk covers positions start .. stop - 1
            stop = start + int(step.query_lens[i])
            for feature in features:
                if feature.overlaps(start, stop):
                    lo, hi = max(start, feature.offset), min(stop, feature.end)
                    rows = self.encoder_cache[feature.identifier][lo - feature.offset : hi - feature.offset]
                    merges.append((flat + lo - start, flat + hi - start, rows))
            if stop >= features[-1].end:
                passed.append(req_id)
        for req_id in passed:  # every placeholder computed: nothing more to merge for it
            del self.features[req_id]
        if not merges:
            return None
        embeds = self.model.embed_input_ids(step.input_ids)  # (T, hidden)
        for lo, hi, rows in merges:
            embeds[lo:hi] = rows.to(embeds.dtype)
        return embeds


class MRopePositions:
    """(3, T) positions per step for a model that ``supports_mrope`` (see the module docstring)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.prompt: dict[RequestId, np.ndarray] = {}
        """(3, prompt length) int64 positions of each request with images."""
        self.delta: dict[RequestId, int] = {}
        self._version = -1
        self._row_delta = np.zeros(0, dtype=np.int64)
        """(num_rows,) each batch row's delta, rebuilt when the batch's membership changes."""
        self._row_prompt_len = np.zeros(0, dtype=np.int64)
        """(num_rows,) prompt length of rows with images; 0 for the others (their 1-D positions will do)."""

    def add(self, new: NewRequestData) -> None:
        """A request joins the batch (again, after a preemption: same prompt, same positions)."""
        if not new.mm_features:
            return
        prompt = new.token_ids[: new.num_prompt_tokens]
        positions, delta = self.model.get_mrope_input_positions(prompt, new.mm_features)
        self.prompt[new.req_id] = positions.numpy()
        self.delta[new.req_id] = int(delta)

    def remove(self, req_id: RequestId) -> None:
        self.prompt.pop(req_id, None)
        self.delta.pop(req_id, None)

    def positions(self, batch: InputBatch, step: StepInputs) -> torch.Tensor:
        """(3, T) int64 on the device for the step's tokens."""
        self._refresh(batch)
        flat, rows = step.token_positions, step.token_rows  # (T,) each
        out = np.empty((3, len(flat)), dtype=np.int64)
        out[:] = flat + self._row_delta[rows]
        in_prompt = np.flatnonzero(flat < self._row_prompt_len[rows])  # prompt tokens of requests with images
        for row in np.unique(rows[in_prompt]).tolist():
            tokens = in_prompt[rows[in_prompt] == row]
            out[:, tokens] = self.prompt[batch.req_ids[row]][:, flat[tokens]]
        return torch.from_numpy(out).to(self.device)

    def _refresh(self, batch: InputBatch) -> None:
        if batch.version == self._version:
            return
        ids = batch.req_ids[: batch.num_rows]
        self._row_delta = np.fromiter((self.delta.get(r, 0) for r in ids), dtype=np.int64, count=len(ids))
        self._row_prompt_len = np.fromiter(
            (self.prompt[r].shape[1] if r in self.prompt else 0 for r in ids), dtype=np.int64, count=len(ids)
        )
        self._version = batch.version

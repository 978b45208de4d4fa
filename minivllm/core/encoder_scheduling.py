"""The scheduler's half of multimodal inputs: when each image's vision encoder runs.

vLLM-v1 encoder scheduling. An image's embeddings are needed by the step whose
scheduled tokens first reach its placeholders (``MultiModalFeature.offset ..
end``); the encoder runs in that step and its output stays in the workers'
encoder cache until every placeholder has KV, so a prefill chunked through an
image computes the image once. Two limits hold per step and over time:

- the encoder budget (``scheduler.max_num_encoder_input_tokens``): placeholder
  tokens of the images encoded in one step;
- the encoder cache (``scheduler.encoder_cache_size``, in tokens): outputs held
  between steps.

When an image that the step's tokens reach does not fit either, the request's
chunk is cut to stop just before the image (nothing of it is scheduled when the
chunk starts inside it); the image is encoded in a later step.

An entry is freed once the request's computed tokens pass the image's end, or
when the request finishes or is preempted (a preempted request encodes again
when it is readmitted). Frees reach the workers with the next step
(``SchedulerOutput.free_encoder_input_ids``). Text-only requests never get here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.request import Request, RequestId

EncoderInputId = tuple[RequestId, int]
"""(request, index into its ``mm_features``)."""


@dataclass
class EncoderStep:
    """One step's encoder decisions (part of the step's plan)."""

    budget: int
    """Placeholder tokens the step may still encode."""
    inputs: dict[RequestId, list[int]] = field(default_factory=dict)


class EncoderCacheManager:
    """Which encoder outputs the workers hold, and how many tokens they take."""

    def __init__(self, max_encoder_tokens_per_step: int, cache_size: int) -> None:
        self.max_per_step = max_encoder_tokens_per_step
        self.cache_size = cache_size
        self.num_free = cache_size
        self.cached: dict[RequestId, dict[int, int]] = {}
        """request -> feature index -> its tokens in the cache."""
        self._freed: list[EncoderInputId] = []

    def new_step(self) -> EncoderStep:
        return EncoderStep(budget=self.max_per_step)

    def has(self, req_id: RequestId, index: int) -> bool:
        held = self.cached.get(req_id)
        return held is not None and index in held

    def plan(self, request: Request, num_computed: int, num_new: int, step: EncoderStep) -> tuple[list[int], int]:
        """The features to encode for ``num_new`` tokens from ``num_computed`` on, and ``num_new``
        cut where an image the tokens reach cannot be encoded in this step (0: nothing fits).
        Changes nothing: ``commit`` takes the budget and the cache once the step keeps the request."""
        to_encode: list[int] = []
        budget, free = step.budget, self.num_free
        stop = num_computed + num_new
        for index, feature in enumerate(request.mm_features):
            if feature.offset >= stop:
                break  # sorted by offset: no later image is reached either
            if feature.end <= num_computed or self.has(request.request_id, index):
                continue  # its placeholders have KV already, or its output is cached
            if feature.length > budget or feature.length > free:
                num_new = max(feature.offset - num_computed, 0)
                break
            budget -= feature.length
            free -= feature.length
            to_encode.append(index)
        return to_encode, num_new

    def commit(self, request: Request, indices: list[int], step: EncoderStep) -> None:
        if not indices:
            return
        held = self.cached.setdefault(request.request_id, {})
        for index in indices:
            length = request.mm_features[index].length
            held[index] = length
            self.num_free -= length
            step.budget -= length
        step.inputs[request.request_id] = indices

    def free_consumed(self, request: Request) -> None:
        """Free the outputs whose placeholders all have KV now (after the step advanced the request)."""
        held = self.cached.get(request.request_id)
        if not held:
            return
        computed = request.num_computed_tokens
        for index in [i for i in held if request.mm_features[i].end <= computed]:
            self.num_free += held.pop(index)
            self._freed.append((request.request_id, index))
        if not held:
            del self.cached[request.request_id]

    def free(self, req_id: RequestId) -> None:
        """Free every output of a request that finished or was preempted."""
        held = self.cached.pop(req_id, None)
        for index, length in (held or {}).items():
            self.num_free += length
            self._freed.append((req_id, index))

    def take_freed(self) -> list[EncoderInputId]:
        freed, self._freed = self._freed, []
        return freed

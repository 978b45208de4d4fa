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

Entries are keyed by the image's identifier (its content hash), so requests
holding the same image (the ``n`` completions of one prompt, or the same picture
sent twice) share one encoder output. A request stops referencing an entry once
its computed tokens pass the image's end, or when it finishes or is preempted
(a preempted request encodes again when it is readmitted, unless another request
still holds the image); an entry no request references is freed, and the frees
reach the workers with the next step (``SchedulerOutput.free_encoder_input_ids``).
Text-only requests never get here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.request import Request, RequestId


@dataclass
class EncoderStep:
    """One step's encoder decisions (part of the step's plan)."""

    budget: int
    """Placeholder tokens the step may still encode."""
    inputs: dict[RequestId, list[int]] = field(default_factory=dict)


class EncoderCacheManager:
    """Which encoder outputs the workers hold, who uses them, and how many tokens they take."""

    def __init__(self, max_encoder_tokens_per_step: int, cache_size: int) -> None:
        self.max_per_step = max_encoder_tokens_per_step
        self.cache_size = cache_size
        self.num_free = cache_size
        self.cached: dict[str, int] = {}
        """identifier -> its tokens in the cache."""
        self.users: dict[str, set[RequestId]] = {}
        """identifier -> the requests that still need it."""
        self.held: dict[RequestId, set[int]] = {}
        """request -> indices of its features it references in the cache."""
        self._freed: list[str] = []

    def new_step(self) -> EncoderStep:
        return EncoderStep(budget=self.max_per_step)

    def fit(self, request: Request, num_computed: int, num_new: int, step: EncoderStep) -> int:
        """``num_new`` tokens from ``num_computed`` on, cut where an image they reach cannot be
        encoded in this step (0: nothing fits). Changes nothing: ``commit`` references and
        encodes the images once the step keeps the request."""
        budget, free = step.budget, self.num_free
        stop = num_computed + num_new
        seen: set[str] = set()
        for feature in request.mm_features:
            if feature.offset >= stop:
                break  # sorted by offset: no later image is reached either
            if feature.end <= num_computed or feature.identifier in self.cached or feature.identifier in seen:
                continue  # its placeholders have KV already, or its output is (or will be) cached
            if feature.length > budget or feature.length > free:
                num_new = max(feature.offset - num_computed, 0)
                break
            budget -= feature.length
            free -= feature.length
            seen.add(feature.identifier)
        return num_new

    def commit(self, request: Request, step: EncoderStep, num_computed: int, num_new: int) -> None:
        """The step keeps ``num_new`` tokens of the request from ``num_computed`` on: reference every
        image they reach, encoding those not cached. Decided here rather than taken from ``plan``:
        blocks for the request may have preempted another holder of an image in between."""
        stop = num_computed + num_new
        held = self.held.setdefault(request.request_id, set())
        encode = []
        for index, feature in enumerate(request.mm_features):
            if feature.offset >= stop:
                break
            if feature.end <= num_computed or index in held:
                continue
            if feature.identifier not in self.cached:
                self.cached[feature.identifier] = feature.length
                self.num_free -= feature.length
                step.budget -= feature.length
                encode.append(index)
            self.users.setdefault(feature.identifier, set()).add(request.request_id)
            held.add(index)
        if encode:
            step.inputs[request.request_id] = encode
        if not held:
            del self.held[request.request_id]

    def free_consumed(self, request: Request) -> None:
        """Drop the request's references to images whose placeholders all have KV now."""
        held = self.held.get(request.request_id)
        if not held:
            return
        computed, features = request.num_computed_tokens, request.mm_features
        for index in [i for i in held if features[i].end <= computed]:
            held.discard(index)
            self._release(features[index].identifier, request.request_id)
        if not held:
            del self.held[request.request_id]

    def free(self, request: Request) -> None:
        """Drop every reference of a request that finished or was preempted."""
        for index in self.held.pop(request.request_id, ()):
            self._release(request.mm_features[index].identifier, request.request_id)

    def _release(self, identifier: str, req_id: RequestId) -> None:
        users = self.users.get(identifier)
        if users is None:
            return
        users.discard(req_id)
        if not users:
            del self.users[identifier]
            self.num_free += self.cached.pop(identifier)
            self._freed.append(identifier)

    def take_freed(self) -> list[str]:
        freed, self._freed = self._freed, []
        return freed

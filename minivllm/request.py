"""A request as the engine core sees it: token ids, progress and status.

The types here cross every boundary between the front end, the scheduler and
the workers, so they sit at the bottom of the package graph and import nothing
from the engine's packages.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NewType

if TYPE_CHECKING:  # annotations only: neither is needed at run time
    from minivllm.lora_request import LoRARequest
    from minivllm.multimodal.feature import MultiModalFeature
    from minivllm.sampling_params import SamplingParams

RequestId = NewType("RequestId", str)
BlockHash = NewType("BlockHash", bytes)
"""A full KV block's content hash (``core/block_hash.py`` computes them)."""


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(eq=False)
class Request:
    """One sequence being generated.

    Invariant: ``num_computed_tokens <= num_tokens``; the tokens at positions
    ``num_computed_tokens ..`` have no KV in the cache yet. Preemption resets
    ``num_computed_tokens`` to 0 (recompute) but keeps ``output_token_ids``.
    """

    request_id: RequestId
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_tokens: int
    """Output tokens allowed: min(params.max_tokens, max_model_len - prompt length)."""
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the request, if any."""
    cache_salt: str | None = None
    """Mixed into the prefix-cache hashes: only requests with the same salt share blocks."""
    lora_request: LoRARequest | None = None
    """The adapter the request runs under (None: the base model); also in its block hashes."""
    num_cached_tokens: int | None = None
    """Prompt tokens found in the prefix cache when first scheduled (None until then)."""
    kv_transfer_params: dict[str, Any] | None = None
    """Set when it finishes, by a KV connector that holds its prompt's KV for another engine."""
    group_id: str | None = None
    """The client request this sequence belongs to: its parent (one of ``n`` completions),
    or a server request that sent several prompts. The waiting queue takes turns between
    groups. None: the request is a group of its own."""
    block_hashes: list[BlockHash] = field(default_factory=list)
    """Prefix-cache hashes of the request's full blocks so far (filled by the KV-cache manager)."""
    final_output_only: bool = False
    """The front end reads this request's tokens only with its first output and once it
    finished (a final-only request without stop strings or logprobs): the scheduler
    skips the outputs in between and sends the tokens they held with the last one."""
    num_reported_tokens: int = 0
    """Output tokens already sent to the front end."""
    added_after_step: int = 0
    """The scheduler's step count when the request was added: outputs of steps scheduled
    before it belong to an earlier request with the same id (aborted while in flight)."""
    rolled_back_after_step: int = 0
    """A KV connector's load for it failed when the scheduler had scheduled this many steps:
    what those steps sampled for it is dropped (``Scheduler._recover_failed_loads``)."""
    num_output_placeholders: int = 0
    """With async scheduling: tokens that scheduled steps sample but whose values are not
    known yet (at most one per step in flight). The scheduler already counts them as the
    request's next inputs; see ``Scheduler``."""
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    """The prompt's images, sorted by ``offset`` (empty for a text prompt); the scheduler
    runs their encoder when its scheduled tokens first reach their placeholders."""

    @property
    def lora_int_id(self) -> int | None:
        return None if self.lora_request is None else self.lora_request.lora_int_id

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def token_ids_from(self, start: int) -> list[int]:
        """``all_token_ids[start:]`` without copying the whole sequence."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n :]
        return self.prompt_token_ids[start:] + self.output_token_ids

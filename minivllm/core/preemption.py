"""Preemption: a running request gives its KV blocks back and waits to be recomputed.

When the KV cache cannot hold a running request's next tokens, the last request
of the running order is preempted (its blocks freed) and goes to the front of
the waiting queue, so it resumes before newer requests. The running order is
the order running requests get budget and blocks in, so a victim, taken from its
end, is never already scheduled in the step.

With ``scheduler.policy=priority`` the order is ``(priority, arrival_time)``
(lower first), and before each step the head of the waiting queue preempts
running requests of strictly lower priority until it could be admitted.
"""

from __future__ import annotations

import logging

from minivllm.core.admission import AdmissionLimits, could_admit
from minivllm.core.encoder_scheduling import EncoderCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.request_queue import FairRequestQueue
from minivllm.request import Request, RequestStatus

logger = logging.getLogger(__name__)


def running_order(running: list[Request], policy: str) -> list[Request]:
    """The order running requests get budget and blocks in; preemption victims
    are taken from its end, so they are never already scheduled."""
    if policy == "priority":
        index = {id(r): i for i, r in enumerate(running)}
        return sorted(running, key=lambda r: (r.priority, r.arrival_time, index[id(r)]))
    return list(running)


def priority_victim(
    head: Request, running: list[Request], kv: KVCacheManager, limits: AdmissionLimits
) -> Request | None:
    """Priority policy: the running request to preempt so that ``head`` (of the waiting
    queue) gets a seat and blocks for its first chunk; None when it could be admitted
    already, or when no running request has a strictly lower priority."""
    if not running or could_admit(head, len(running), kv, limits):
        return None
    victim = running_order(running, "priority")[-1]
    return victim if victim.priority > head.priority else None


def evict(
    request: Request,
    running: list[Request],
    waiting: FairRequestQueue,
    kv: KVCacheManager,
    encoder: EncoderCacheManager,
) -> None:
    """Take a running request back to the front of the waiting queue, its blocks (and
    images' encoder outputs) freed and its tokens to be computed again."""
    running.remove(request)
    kv.free(request)
    if request.mm_features:
        encoder.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    waiting.appendleft(request)


def warn_first_preemption(request: Request) -> None:
    logger.warning(
        "Request %s was preempted: the KV cache is full. Preempted requests are recomputed later, "
        "which costs time; give the cache more memory (cache.gpu_memory_utilization, "
        "cache.cpu_memory_gb) or lower scheduler.max_num_seqs.",
        request.request_id,
    )

"""The stop rules: whether a request's newest output token finishes it.

A decision without side effects (as vLLM's ``check_stop``): the scheduler
applies it (records the stop token, finishes the request). The rules, in order:
EOS (unless ``ignore_eos``) and the request's stop token ids stop it, but only
from its ``min_tokens``-th output token on; reaching ``max_tokens`` ends it by
length. Stop strings are not here: they need text, which only the engine has.
"""

from __future__ import annotations

from minivllm.request import Request, RequestStatus


def check_stop(request: Request, token: int) -> RequestStatus | None:
    """How ``token``, just appended as the request's last output token, finishes it:
    ``FINISHED_STOPPED``, ``FINISHED_LENGTH``, or None when the request goes on."""
    params = request.sampling_params
    num_output_tokens = len(request.output_token_ids)
    if num_output_tokens >= params.min_tokens:
        if _is_eos(request, token) or token in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None


def stop_reason(request: Request, token: int) -> int | None:
    """What a request that ``check_stop`` stopped at ``token`` reports as its
    ``stop_reason``: the stop token id, or None for EOS."""
    return None if _is_eos(request, token) else token


def _is_eos(request: Request, token: int) -> bool:
    return token == request.eos_token_id and not request.sampling_params.ignore_eos

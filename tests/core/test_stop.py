"""check_stop decides and changes nothing; the scheduler applies its decision."""

import copy

import pytest

from minivllm.core.stop import check_stop, stop_reason
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.sampling_params import SamplingParams

EOS = 2
STOPPED, LENGTH = RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH


def _after(outputs: list[int], max_tokens: int = 5, **params) -> Request:
    """A running request whose newest output token is ``outputs[-1]``."""
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
    request = Request(RequestId("a"), [7, 8], sampling, eos_token_id=EOS, max_tokens=max_tokens)
    request.output_token_ids.extend(outputs)
    request.status = RequestStatus.RUNNING
    return request


@pytest.mark.parametrize(
    "outputs, params, status, reason",
    [
        ([5, 6], {}, None, None),
        ([5, EOS], {}, STOPPED, None),
        ([5, EOS], {"ignore_eos": True}, None, None),
        ([5, 9], {"stop_token_ids": [9]}, STOPPED, 9),
        ([EOS], {"min_tokens": 2}, None, None),
        ([5, 9], {"min_tokens": 2, "stop_token_ids": [9]}, STOPPED, 9),
        ([EOS], {"min_tokens": 2, "stop_token_ids": [EOS]}, None, None),
        ([3, 4, 5, 6, 7], {}, LENGTH, None),
        ([3, 4, 5, 6, EOS], {}, STOPPED, None),  # the stop wins over the length
        ([3, 4, 5, 6, 9], {"min_tokens": 5, "stop_token_ids": [9]}, STOPPED, 9),
    ],
)
def test_check_stop_decides_without_side_effects(outputs, params, status, reason):
    request = _after(outputs, **params)
    before = copy.deepcopy(vars(request))
    assert check_stop(request, outputs[-1]) is status
    assert vars(request) == before
    if status is STOPPED:
        assert stop_reason(request, outputs[-1]) == reason

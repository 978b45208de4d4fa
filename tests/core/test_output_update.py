"""The update loop's one-token path stops a request exactly where the stop rules say."""

import pytest

from minivllm.outputs import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams
from tests.core.scheduler_helpers import base_config, make_request, make_scheduler

EOS = 2


def expected_stop(tokens, max_tokens, min_tokens=0, ignore_eos=False, stop_token_ids=()):
    """The stop rules, written out: (tokens kept, finish reason, stop reason)."""
    for i, token in enumerate(tokens):
        n = i + 1
        if n >= min_tokens and ((token == EOS and not ignore_eos) or token in stop_token_ids):
            return tokens[:n], "stop", None if token == EOS and not ignore_eos else token
        if n >= max_tokens:
            return tokens[:n], "length", None
    return tokens, None, None


@pytest.mark.parametrize(
    "tokens, params",
    [
        ([5, 6, EOS, 7], {}),
        ([5, EOS, 7, 8, 9], {"ignore_eos": True}),
        ([5, 9, 7], {"stop_token_ids": [9]}),
        ([EOS, 9, 5, EOS, 6], {"min_tokens": 3, "stop_token_ids": [9]}),
        ([5, 6, 7, 8, 9, 10], {}),
        ([5, 6, 7, 8, 9, 10], {"max_tokens": 3, "stop_token_ids": [7]}),
    ],
)
def test_one_token_steps_stop_where_the_rules_say(tokens, params):
    max_tokens = params.pop("max_tokens", 5)
    sched = make_scheduler(base_config(), 16, block_size=4, enable_prefix_caching=False)
    request = make_request([11, 12, 13], max_tokens=max_tokens)
    request.sampling_params = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
    request.eos_token_id = EOS
    sched.add_request(request)
    reported, reasons = [], []
    for token in tokens:
        if request.is_finished:
            break
        out = sched.schedule()
        (result,) = sched.update_from_output(out, ModelRunnerOutput({request.request_id: [token]}))
        reported += result.new_token_ids
        reasons.append(result.finish_reason)
    kept, finish_reason, stop_reason = expected_stop(tokens, max_tokens, **params)
    assert reported == request.output_token_ids == kept
    assert request.status.finish_reason == finish_reason
    assert reasons == [None] * (len(kept) - 1) + [finish_reason]
    assert request.stop_reason == stop_reason

"""The context-window refusal's wording: vLLM's offline one from the engine, and the
server's, which speaks of the route's input (a chat request's messages, a completion's
prompt). The counts are checked against the arithmetic of each case."""

from __future__ import annotations

import pytest

from minivllm.context_length import ContextLengthExceeded, check_prompt_fits, check_request_fits, served_message


def refusal(check, *args) -> ContextLengthExceeded:
    with pytest.raises(ContextLengthExceeded) as info:
        check(*args)
    return info.value


def test_offline_wording_speaks_of_the_decoder_prompt():
    err = refusal(check_prompt_fits, 130, 4, 128)
    assert str(err).startswith("The decoder prompt (length 130) is longer than the maximum model length of 128. ")
    assert "messages" not in str(err) and err.param == "prompt"
    full = refusal(check_prompt_fits, 128, None, 128)
    expected = "The decoder prompt (length 128) plus the number of requested output tokens (at least 1) is longer"
    assert str(full).startswith(expected)
    over = refusal(check_request_fits, 3, 200, 128)
    assert str(over).startswith("The decoder prompt (length 3) plus max_tokens=200 is longer than the maximum")
    assert over.param == "max_tokens"
    check_prompt_fits(127, 4, 128)
    check_request_fits(124, 4, 128)


@pytest.mark.parametrize("subject", ["messages", "prompt"])
def test_the_server_speaks_of_the_routes_input(subject):
    for err, prompt, completion in [
        (refusal(check_prompt_fits, 130, 4, 128), 130, 4),
        (refusal(check_request_fits, 3, 200, 128), 3, 200),
    ]:
        other = "prompt" if subject == "messages" else "messages"
        message = served_message(err, subject)
        assert message.startswith(
            f"This model's maximum context length is 128 tokens. However, you requested {prompt + completion} tokens "
        )
        assert f"({prompt} in the {subject}, {completion} in the completion)" in message
        assert message.endswith(f"Please reduce the length of the {subject} or completion.")
        assert other not in message

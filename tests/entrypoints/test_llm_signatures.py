"""LLM's methods take their options by keyword, as vLLM's do: in vLLM the fourth positional
argument of ``generate`` would be an adapter, here it was a priority, so positions are refused."""

from __future__ import annotations

import inspect

import pytest

from minivllm import LLM

# each method's parameters that may be given by position, after self
POSITIONAL = {
    "generate": ["prompts", "sampling_params"],
    "chat": ["messages", "sampling_params"],
    "beam_search": ["prompts", "params"],
    "encode": ["prompts", "pooling_params"],
    "embed": ["prompts", "pooling_params"],
}


@pytest.mark.parametrize("method", sorted(POSITIONAL))
def test_options_are_keyword_only(method: str) -> None:
    params = list(inspect.signature(getattr(LLM, method)).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert positional == POSITIONAL[method]
    assert "use_tqdm" in {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

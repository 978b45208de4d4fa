"""Bad input fails before any work starts, names the problem, and leaves the
engine serving the next call."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tokenizers.processors import TemplateProcessing

from minivllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    llm = LLM(model=str(llama_dir), dtype="float32", block_size=4, num_gpu_blocks_override=20, max_model_len=128)
    yield llm
    llm.shutdown()


def _still_serves(llm: LLM) -> None:
    out = llm.generate(["def f():"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    stats = llm.llm_engine.scheduler_stats()
    assert stats.num_free_blocks == stats.num_blocks
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "prompt,params,match",
    [
        ("", SamplingParams(max_tokens=4), "^prompt: '' tokenizes to no tokens .*decoder prompt cannot be empty"),
        ({"prompt": ""}, SamplingParams(max_tokens=4), "^prompt: '' tokenizes to no tokens"),
        ({"prompt_token_ids": []}, SamplingParams(max_tokens=4), "^prompt_token_ids: is empty"),
        ([], SamplingParams(max_tokens=4), "^prompt_token_ids: is empty"),
        (
            {"prompt_token_ids": list(range(5, 135))},
            SamplingParams(max_tokens=4),
            r"^The decoder prompt \(length 130\) is longer than the maximum model length of 128\. ",
        ),
        ({"prompt_token_ids": [1, 99999]}, SamplingParams(max_tokens=4), "outside the vocabulary"),
        ({"prompt_token_ids": [1, 2.5]}, SamplingParams(max_tokens=4), "prompt_token_ids: must be a list of integer"),
        ({"prompt_token_ids": [5] * 60}, SamplingParams(max_tokens=27), "can never fit the KV cache"),
        (3.5, SamplingParams(max_tokens=4), "prompt: expected"),
        ("def f():", SamplingParams(n=129, max_tokens=1), r"n=129: must be in \[1, 128\] \(serve.max_n=128\)"),
    ],
)
def test_bad_prompts_raise_and_the_engine_keeps_serving(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["def ok():", prompt], params, use_tqdm=False)
    _still_serves(llm)


def test_an_empty_text_is_served_when_the_tokenizer_adds_a_bos_token(llm):
    """As in vLLM, emptiness is judged on the token ids: ``""`` is ``[bos]`` here."""
    tokenizer = llm.get_tokenizer()
    backend, bos = tokenizer.backend_tokenizer, tokenizer.bos_token
    before = backend.post_processor
    backend.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)])
    try:
        assert tokenizer.encode("") == [tokenizer.bos_token_id]
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        text, ids = llm.generate(["", {"prompt_token_ids": [tokenizer.bos_token_id]}], params, use_tqdm=False)
    finally:
        backend.post_processor = before
    assert text.prompt_token_ids == [tokenizer.bos_token_id] and text.prompt == ""
    assert text.outputs[0].token_ids == ids.outputs[0].token_ids and len(ids.outputs[0].token_ids) == 3
    _still_serves(llm)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        SamplingParams(**kwargs)


def test_logprobs_above_the_cap_are_rejected(llm):
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.generate(["x"], SamplingParams(logprobs=1000), use_tqdm=False)
    _still_serves(llm)


def test_sampling_params_list_must_match_prompts(llm):
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False)
    _still_serves(llm)


def test_unknown_model_path_is_a_clear_error():
    with pytest.raises(ValueError, match="model.path='/no/such/model'"):
        LLM(model="/no/such/model")


def test_preset_without_weights_says_how_to_proceed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="load.format=dummy"):
        LLM(model="opt-125m")


@pytest.mark.parametrize(
    "kwargs,field", [({"max_tokens": "ten"}, "max_tokens"), ({"temperature": None}, "temperature")]
)
def test_wrong_types_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}=.*must be a number"):
        SamplingParams(**kwargs)


def test_an_over_long_prompt_gets_our_error_without_the_tokenizer_warning(llm, caplog):
    tokenizer = llm.llm_engine.tokenizer
    before, tokenizer.model_max_length = tokenizer.model_max_length, 16
    tokenizer.deprecation_warnings.clear()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="maximum model length of 128"):
            llm.generate("x = 1\n" * 200, SamplingParams(max_tokens=4), use_tqdm=False)
    finally:
        tokenizer.model_max_length = before
    assert "Token indices sequence length" not in caplog.text
    _still_serves(llm)


def test_numpy_and_torch_token_ids_are_token_ids(llm):
    """``tokenizer(..., return_tensors="np")["input_ids"][0]`` and the like work as a list would."""
    ids = [5, 6, 7]
    params = SamplingParams(temperature=0, max_tokens=3)
    want = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0].token_ids
    for given in (np.array(ids), torch.tensor(ids), [np.int64(t) for t in ids]):
        out = llm.generate({"prompt_token_ids": given}, params, use_tqdm=False)[0]
        assert out.prompt_token_ids == ids and all(type(t) is int for t in out.prompt_token_ids)
        assert out.outputs[0].token_ids == want

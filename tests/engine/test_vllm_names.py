"""``llm.llm_engine.model_config.max_model_len`` and friends, as scripts written for vLLM read them."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm import LLM


@pytest.fixture(scope="module")
def llm(llama_dir):
    llm = LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16, max_model_len=96)
    yield llm
    llm.shutdown()


def test_model_config_holds_the_resolved_values(llm, llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    mc = llm.llm_engine.model_config
    assert mc.max_model_len == 96 and mc.dtype is torch.float32 and mc.model == str(llama_dir)
    assert mc.get_vocab_size() == config["vocab_size"] and mc.get_hidden_size() == config["hidden_size"]
    assert mc.runner_type == "generate" and mc.seed == llm.cfg.model.seed


def test_resolved_max_model_len_when_none_was_asked(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    llm = LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16)
    try:
        assert llm.llm_engine.model_config.max_model_len == config["max_position_embeddings"]
    finally:
        llm.shutdown()


def test_vllm_config_and_get_tokenizer(llm):
    engine = llm.llm_engine
    assert engine.vllm_config is llm.cfg and engine.get_tokenizer() is llm.get_tokenizer()
    with pytest.raises(AttributeError):
        engine.model_config.max_seq_len_to_capture  # noqa: B018 (vLLM has it; the view does not)

"""LLM.embed / LLM.encode against transformers' AutoModel hidden states pooled the same way (fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, BertConfig

from minivllm import LLM, SamplingParams
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.pooling import PoolingParams
from tests.model_configs import llama_config, mistral_config, qwen2_config, qwen3_config

TEXTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n" * 2,
    "x",
]
ENGINE = dict(dtype="float32", block_size=4, num_gpu_blocks_override=128, disable_log_stats=True)


def _reference(path, token_ids: list[list[int]], pooling: str, normalize: bool) -> list[torch.Tensor]:
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in token_ids:
            hidden = model(torch.tensor([ids])).last_hidden_state[0]  # (P, H)
            vec = hidden[-1] if pooling == "LAST" else hidden.mean(dim=0)
            out.append(torch.nn.functional.normalize(vec, dim=-1) if normalize else vec)
    return out


@pytest.fixture(scope="module", params=["llama_dir", "qwen3"])
def checkpoint(request, make_checkpoint):
    torch.set_num_threads(1)
    if request.param == "qwen3":
        return make_checkpoint("qwen3-embed", qwen3_config())
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize(("pooling", "normalize"), [("LAST", True), ("MEAN", False)])
def test_embeddings_match_transformers(checkpoint, pooling, normalize):
    # a 16-token step budget splits the long prompt into prefill chunks
    llm = LLM(
        str(checkpoint),
        runner="pooling",
        max_num_batched_tokens=16,
        **ENGINE,
        overrides=[f"model.pooler_config.pooling_type={pooling}", f"model.pooler_config.normalize={normalize}"],
    )
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in TEXTS]
    assert len(ids[1]) > 16
    outs = llm.embed(TEXTS, use_tqdm=False)
    want = _reference(checkpoint, ids, pooling, normalize)
    for out, ref, prompt in zip(outs, want, ids):
        assert out.prompt_token_ids == prompt
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-4, rtol=0)
    if pooling == "LAST":  # the prefix cache serves repeated prompts; the last token is still computed
        again = llm.encode(TEXTS[1], use_tqdm=False)[0]
        assert again.num_cached_tokens > 0
        torch.testing.assert_close(again.outputs.data, want[1], atol=1e-4, rtol=0)
    else:
        assert llm.cfg.cache.enable_prefix_caching is False


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_pooling_under_async_scheduling(llama_dir, pooling):
    """Overlapped steps (the default on CUDA) pool the same vectors, chunked prompts included."""
    llm = LLM(
        str(llama_dir),
        runner="pooling",
        max_num_batched_tokens=16,
        **ENGINE,
        overrides=[f"model.pooler_config.pooling_type={pooling}", "scheduler.async_scheduling=true"],
    )
    assert llm.cfg.async_scheduling
    ids = [llm.get_tokenizer().encode(t) for t in TEXTS]
    outs = llm.embed(TEXTS, use_tqdm=False)
    for out, ref in zip(outs, _reference(llama_dir, ids, pooling, normalize=True)):
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-4, rtol=0)


def test_per_request_normalize_and_matryoshka_dimensions(llama_dir):
    llm = LLM(str(llama_dir), task="embed", hf_overrides={"is_matryoshka": True}, **ENGINE)
    raw = llm.embed("def f(x):", PoolingParams(normalize=False), use_tqdm=False)[0].outputs.embedding
    cut = llm.embed("def f(x):", PoolingParams(dimensions=8), use_tqdm=False)[0].outputs.embedding
    want = torch.nn.functional.normalize(torch.tensor(raw[:8]), dim=-1)
    torch.testing.assert_close(torch.tensor(cut), want, atol=1e-6, rtol=0)
    assert len(raw) == llm.cfg.hf_config.hidden_size


def test_wrong_runner_dimensions_and_encoder_only_are_clear_errors(llama_dir, tmp_path):
    gen = LLM(str(llama_dir), **ENGINE)
    with pytest.raises(ValueError, match="embed.*runner='pooling'"):
        gen.embed("x", use_tqdm=False)
    pool = LLM(str(llama_dir), runner="pooling", **ENGINE)
    with pytest.raises(ValueError, match="generate.*runner='generate'"):
        pool.generate("x", SamplingParams(), use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions=8.*Matryoshka"):
        pool.embed("x", PoolingParams(dimensions=8), use_tqdm=False)
    assert pool.embed("x", use_tqdm=False)[0].outputs.hidden_size == 64  # the engine still serves
    BertConfig(
        vocab_size=512,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        architectures=["BertModel"],
    ).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="encoder-only.*not supported"):
        VllmConfig.from_dictconfig(config_from_kwargs(str(tmp_path), runner="pooling"))


BASE_MODEL_CASES = {
    "LlamaModel": llama_config,
    "Qwen2Model": qwen2_config,
    "Qwen3Model": qwen3_config,
    "MistralModel": mistral_config,
}
"""Pooling-only architectures -> the config of a checkpoint saved with AutoModel."""


@pytest.mark.parametrize("architecture", sorted(BASE_MODEL_CASES))
def test_base_model_checkpoints_embed(architecture, tmp_path, tokenizer_dir):
    """A checkpoint saved from AutoModel (no ``model.`` prefix, no LM head) against transformers."""
    torch.manual_seed(0)
    base = AutoModel.from_config(BASE_MODEL_CASES[architecture](), dtype=torch.float32)
    base.save_pretrained(tmp_path)
    for f in tokenizer_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert AutoModel.from_pretrained(tmp_path).config.architectures == [architecture]
    llm = LLM(str(tmp_path), runner="pooling", **ENGINE)
    ids = llm.get_tokenizer().encode(TEXTS[1])
    got = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(got), _reference(tmp_path, [ids], "LAST", True)[0], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="no LM head.*runner=pooling"):
        VllmConfig.from_dictconfig(config_from_kwargs(str(tmp_path)))

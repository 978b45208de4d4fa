"""Load formats and dtypes: the same weights whichever way they are stored."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.model_configs import llama_config

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = ["def f(x):", "import"]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_tokens(llama_dir):
    return _tokens(LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16))


def test_sharded_safetensors_with_index(make_checkpoint, reference_tokens):
    ckpt = make_checkpoint("llama-sharded", llama_config(tie=False), max_shard_size="40KB")
    assert (ckpt / "model.safetensors.index.json").is_file()
    assert len(list(ckpt.glob("*.safetensors"))) > 1
    llm = LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=16, load_format="safetensors")
    assert _tokens(llm) == reference_tokens


def test_pt_format(make_checkpoint, reference_tokens):
    ckpt = make_checkpoint("llama-pt", llama_config(tie=False), safe_serialization=False)
    assert not list(ckpt.glob("*.safetensors"))
    for fmt in ("auto", "pt"):
        llm = LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=16, load_format=fmt)
        assert _tokens(llm) == reference_tokens


def test_safetensors_format_without_files_names_the_problem(make_checkpoint):
    ckpt = make_checkpoint("llama-pt", llama_config(tie=False), safe_serialization=False)
    with pytest.raises(ValueError, match="load.format=safetensors"):
        LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=16, load_format="safetensors")


def test_dummy_format_needs_no_weight_files(llama_dir):
    llm = LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16, load_format="dummy", seed=1)
    tokens = _tokens(llm)
    assert all(len(t) == 6 for t in tokens)
    params = list(llm.llm_engine.core.executor.worker.model_runner.model.parameters())
    assert all(p.abs().max() <= 1.001 + 1e-3 for p in params)  # uniform(-1e-3, 1e-3), norms around 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_loads_and_generates(llama_dir, dtype):
    llm = LLM(model=str(llama_dir), dtype=dtype, num_gpu_blocks_override=16)
    runner = llm.llm_engine.core.executor.worker.model_runner
    assert {p.dtype for p in runner.model.parameters()} == {getattr(torch, dtype)}
    assert runner.kv_caches[0].dtype == getattr(torch, dtype)
    assert all(len(t) == 6 for t in _tokens(llm))


def test_tied_embedding_shares_storage(llama_tied_dir):
    llm = LLM(model=str(llama_tied_dir), dtype="float32", num_gpu_blocks_override=16)
    model = llm.llm_engine.core.executor.worker.model_runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight

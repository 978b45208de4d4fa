"""load.format=gguf: llama.cpp files written here with the ``gguf`` package, checked
against transformers' own GGUF loader on the same file."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.model_loader.gguf_loader import unpermute_rotary_rows
from tests.gguf_files import Q, dequantized_reference, permute_for_gguf, write_llama_gguf
from tests.model_configs import llama_config

PROMPTS = ["def f(x):", "import os\nimport", "class Stack:"]
MAX_TOKENS = 8
K_QUANTS = {"blk.0.ffn_down.weight": Q.Q4_K, "blk.1.ffn_down.weight": Q.Q6_K}
CASES = {"F16": (Q.F16, None), "Q8_0": (Q.Q8_0, None), "Q4_0+Q4_K+Q6_K": (Q.Q4_0, K_QUANTS)}


@pytest.fixture(scope="module")
def llama_ffn256(make_checkpoint):
    """K-quant rows hold 256 values, so the MLP is 256 wide (down_proj rows are K-quantized)."""
    return make_checkpoint("llama-ffn256", llama_config(tie=False, intermediate_size=256))


@pytest.fixture(scope="module", params=list(CASES))
def gguf_file(request, llama_ffn256, tmp_path_factory):
    qtype, k_quants = CASES[request.param]
    out = tmp_path_factory.mktemp(f"gguf-{request.param}") / "model.gguf"
    return write_llama_gguf(llama_ffn256, out, qtype, k_quants)


@torch.no_grad()
def _transformers_greedy(gguf_file, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens (EOS allowed, as with ignore_eos) and their logprobs from transformers."""
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    ids, logprobs = list(prompt_ids), []
    for _ in range(MAX_TOKENS):
        last = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)  # (vocab,)
        ids.append(int(last.argmax()))
        logprobs.append(float(last.max()))
    return ids[len(prompt_ids) :], logprobs


def test_greedy_tokens_match_transformers_gguf_loader(gguf_file, llama_ffn256):
    llm = LLM(model=str(gguf_file), dtype="float32", num_gpu_blocks_override=32)
    assert llm.llm_engine.cfg.load.format == "gguf"  # a .gguf path picks the format
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    reference_tok = AutoTokenizer.from_pretrained(llama_ffn256)
    assert [o.prompt_token_ids for o in outs] == [reference_tok(p).input_ids for p in PROMPTS]
    for out in outs:
        tokens, logprobs = _transformers_greedy(gguf_file, out.prompt_token_ids)
        assert out.outputs[0].token_ids == tokens
        ours = [step[t] for step, t in zip(out.outputs[0].logprobs, tokens)]
        assert ours == pytest.approx(logprobs, abs=1e-4)  # same fp32 weights; only summation order differs


def test_k_quant_weights_are_the_reference_dequantization(llama_ffn256, tmp_path):
    path = write_llama_gguf(llama_ffn256, tmp_path / "m.gguf", Q.F16, K_QUANTS)
    llm = LLM(model=str(tmp_path), load_format="gguf", dtype="float32", num_gpu_blocks_override=8)
    model = llm.llm_engine.core.executor.worker.model_runner.model
    for layer, name in enumerate(K_QUANTS):
        reference = dequantized_reference(path, name)  # (hidden, intermediate)
        torch.testing.assert_close(model.model.layers[layer].mlp.down_proj.weight, reference, rtol=0, atol=0)


def test_rotary_row_permutation_round_trips():
    w = torch.randn(4 * 16, 8)  # (heads * head_dim, hidden)
    permuted = torch.from_numpy(permute_for_gguf(w.numpy(), 4))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rotary_rows(permuted, 4), w)


def test_bad_gguf_paths_name_the_key(tmp_path, llama_ffn256):
    with pytest.raises(ValueError, match="model.path=.*needs a .gguf file"):
        LLM(model=str(llama_ffn256), load_format="gguf")
    for name in ("a.gguf", "b.gguf"):
        write_llama_gguf(llama_ffn256, tmp_path / name, Q.F16)
    with pytest.raises(ValueError, match="several .gguf files"):
        LLM(model=str(tmp_path), load_format="gguf")

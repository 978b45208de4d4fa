"""Quantized checkpoints against transformers running their dequantized weights.

The packers in ``packers.py`` write each checkpoint twice: quantized, and as a
plain fp32 checkpoint of the weights the quantized one stands for. Both sides
then compute with bit-identical fp32 weights (dequantization is exact in fp32:
an fp8 or 4-bit integer times an fp16-representable or fp32 scale), so the only
differences are matmul summation order: greedy tokens must be identical and
logprobs within the 1e-4 of the unquantized parity tests.
"""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.hf_reference import hf_greedy
from tests.quantization.conftest import CASES

MAX_TOKENS = 8
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\nclass Config:", "x"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)


def run(ckpt, **kwargs) -> tuple[list[list[int]], list]:
    llm = LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=64, **kwargs)
    try:
        prompts = [llm.get_tokenizer().encode(t) for t in PROMPTS]
        return prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()


def assert_matches(outputs, reference) -> None:
    for out, (ref_tokens, ref_logprobs) in zip(outputs, reference, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == ref_tokens
        ours = [lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert ours == pytest.approx(ref_logprobs, abs=1e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_matches_transformers_on_dequantized_weights(quantized_pair, case):
    quant_dir, dequant_dir = quantized_pair(case)
    prompts, outputs = run(quant_dir)
    assert_matches(outputs, hf_greedy(dequant_dir, prompts, MAX_TOKENS))


def test_quantization_keyword_names_the_checkpoint_method(quantized_pair):
    quant_dir, _ = quantized_pair("awq-g32")
    _, outputs = run(quant_dir, quantization="awq")
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)
    with pytest.raises(ValueError, match="model.quantization='gptq'.*quant_method='awq'"):
        LLM(model=str(quant_dir), quantization="gptq")


def test_online_fp8_quantizes_an_unquantized_checkpoint_per_channel(llama_dir, quantized_pair):
    """``quantization="fp8"`` on plain weights: the same per-channel fp8 weights the packer writes."""
    llm = LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=64, quantization="fp8")
    qkv = llm.llm_engine.core.executor.worker.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (qkv.weight.shape[0],)
    prompts = [llm.get_tokenizer().encode(t) for t in PROMPTS]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    llm.shutdown()
    assert_matches(outputs, hf_greedy(quantized_pair("fp8-channel-dynamic")[1], prompts, MAX_TOKENS))


STORED = {
    "fp8": ("weight", "float8_e4m3fn"),
    "ct-fp8": ("weight", "float8_e4m3fn"),
    "ct-int8": ("weight", "int8"),
    "ct-w4a16": ("qweight", "int32"),
    "ct-w8a16": ("weight", "int8"),
    "awq": ("qweight", "int32"),
    "gptq": ("qweight", "int32"),
}


@pytest.mark.parametrize(
    "case",
    ["fp8-tensor-static", "ct-int8-w8a16", "ct-w4a16-packed-g32", "ct-w8a16-packed-channel", "awq-g32", "gptq-g32"],
)
def test_layers_hold_the_quantized_tensors(quantized_pair, case):
    llm = LLM(model=str(quantized_pair(case)[0]), dtype="float32", num_gpu_blocks_override=8)
    model = llm.llm_engine.core.executor.worker.model_runner.model
    name, dtype = next(v for k, v in STORED.items() if case.startswith(k))
    for layer in (model.model.layers[0].self_attn.qkv_proj, model.model.layers[1].mlp.down_proj):
        assert str(getattr(layer, name).dtype) == f"torch.{dtype}"
        assert not hasattr(layer, "weight") or name == "weight"
    llm.shutdown()


def test_static_input_scales_of_fused_members_keep_the_largest(quantized_pair):
    """q, k and v each bring an input scale for the same input; one scale (their max) remains."""
    from safetensors import safe_open

    quant_dir, _ = quantized_pair("ct-fp8-tensor-static")
    with safe_open(str(quant_dir / "model.safetensors"), "pt") as f:
        scales = [
            f.get_tensor(f"model.layers.0.self_attn.{m}.input_scale").item() for m in ("q_proj", "k_proj", "v_proj")
        ]
    llm = LLM(model=str(quant_dir), dtype="float32", num_gpu_blocks_override=8)
    qkv = llm.llm_engine.core.executor.worker.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.input_scale.tolist() == pytest.approx([max(scales)])
    llm.shutdown()

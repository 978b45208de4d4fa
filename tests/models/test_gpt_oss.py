"""gpt-oss against transformers' ``generate`` (greedy, fp32) on tiny checkpoints built here:
attention sinks, alternating sliding/full layers, biased clamped-SwiGLU experts, YaRN; with
unquantized experts and with MXFP4 experts (random weights quantized into gpt-oss's
blocks/scales format, which transformers dequantizes on the CPU). Alone and under chunked
prefill with a tiny token budget, preemption with a tiny cache, prefix caching and tp=2.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm import LLM, SamplingParams
from minivllm.quantization.mxfp4 import quantize_mxfp4, torch_dequantize_mxfp4, triton_dequantize_mxfp4
from tests.hf_reference import hf_greedy
from tests.model_configs import gpt_oss_config

MAX_TOKENS = 8
PROMPT_LENS = (3, 9, 14, 23)


def _rewrite(ckpt, edit) -> None:
    """Apply ``edit(state) -> state`` to the checkpoint's one safetensors file."""
    (path,) = ckpt.glob("*.safetensors")
    state = edit(load_file(path))
    path.unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, path, metadata={"format": "pt"})


def _strong_sinks(state: dict) -> dict:
    """Sinks of a few nats (the spread init gives ~0.1): they then take a real share of each softmax."""
    gen = torch.Generator().manual_seed(7)
    for name in [n for n in state if n.endswith("self_attn.sinks")]:
        state[name] = 2.0 * torch.randn(state[name].shape, generator=gen) + 1.0
    return state


def _to_mxfp4(state: dict) -> dict:
    """Experts' weights as MXFP4 blocks and scales in gpt-oss's (out, in) layout."""
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = quantize_mxfp4(state.pop(name).transpose(1, 2))  # (E, in, out) -> (E, out, in)
        state[f"{name}_blocks"], state[f"{name}_scales"] = blocks, scales
    return state


@pytest.fixture(scope="module")
def gpt_oss_dirs(make_checkpoint, tmp_path_factory):
    """{"bf16": unquantized experts, "mxfp4": the same weights with MXFP4 experts}."""
    plain = make_checkpoint("gpt-oss-strong-sinks", gpt_oss_config())
    _rewrite(plain, _strong_sinks)  # the name is this module's own, and the fixture runs once
    mx = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    for f in plain.iterdir():
        (mx / f.name).write_bytes(f.read_bytes())
    _rewrite(mx, _to_mxfp4)
    config = json.loads((mx / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["self_attn", "router"]}
    (mx / "config.json").write_text(json.dumps(config))
    return {"plain": plain, "mxfp4": mx}


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(99)
    return [torch.randint(4, 500, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _generate(ckpt, prompts, **kwargs):
    args = dict(dtype="float32", block_size=4, num_gpu_blocks_override=64, max_model_len=64, seed=0)
    llm = LLM(model=str(ckpt), **{**args, **kwargs})
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()


def _assert_matches(outputs, reference) -> None:
    for out, (tokens, logprobs) in zip(outputs, reference, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == tokens
        ours = [lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert ours == pytest.approx(logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def reference(gpt_oss_dirs):
    """transformers' greedy tokens and logprobs per checkpoint kind (computed once)."""
    prompts = _prompts()
    return prompts, {kind: hf_greedy(path, prompts, MAX_TOKENS) for kind, path in gpt_oss_dirs.items()}


def test_the_checkpoint_exercises_sinks_clamp_and_windows(gpt_oss_dirs) -> None:
    state = load_file(next(gpt_oss_dirs["plain"].glob("*.safetensors")))
    assert min(state["model.layers.0.self_attn.sinks"].abs().max(), 1.0) == 1.0  # sinks of nats
    config = json.loads((gpt_oss_dirs["plain"] / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert max(PROMPT_LENS) > config["sliding_window"] and config["rope_parameters"]["rope_type"] == "yarn"
    mx = load_file(next(gpt_oss_dirs["mxfp4"].glob("*.safetensors")))
    assert mx["model.layers.0.mlp.experts.gate_up_proj_blocks"].dtype == torch.uint8
    assert "model.layers.0.mlp.experts.gate_up_proj" not in mx


@pytest.mark.parametrize("kind", ["plain", "mxfp4"])
def test_greedy_matches_transformers(gpt_oss_dirs, reference, kind) -> None:
    prompts, ref = reference
    _assert_matches(_generate(gpt_oss_dirs[kind], prompts), ref[kind])


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("chunked-prefill-budget-8", dict(max_num_batched_tokens=8, enable_chunked_prefill=True)),
        ("preemption-12-blocks", dict(num_gpu_blocks_override=12)),
        ("prefix-caching", dict(enable_prefix_caching=True)),
        ("async-scheduling-chunked", dict(async_scheduling=True, max_num_batched_tokens=8)),
    ],
)
def test_combinations_match_transformers(gpt_oss_dirs, reference, name, kwargs) -> None:
    prompts, ref = reference
    if name == "prefix-caching":  # each prompt twice: the second run reads the first one's blocks
        prompts, ref = prompts + prompts, {"plain": ref["plain"] + ref["plain"]}
    _assert_matches(_generate(gpt_oss_dirs["plain"], prompts, **kwargs), ref["plain"])


def test_tp2_mxfp4_matches_transformers(gpt_oss_dirs, reference) -> None:
    """Two ranks: heads (and their sinks) and each expert's intermediate dim split, MXFP4 dequantized per rank."""
    prompts, ref = reference
    _assert_matches(_generate(gpt_oss_dirs["mxfp4"], prompts, tensor_parallel_size=2), ref["mxfp4"])


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton backend runs on the CPU in the interpreter"
)
def test_fp8_kv_cache_same_in_both_backends(gpt_oss_dirs) -> None:
    """Sinks over an fp8 cache: both backends read the same fp8 keys and values and agree token for
    token (each against a float64 reference: tests/attention/test_attention_sinks.py); how far an fp8
    cache moves a model is measured on real margins in tests/engine/test_fp8_kv_cache_e2e.py."""
    prompts = _prompts()
    runs = {
        backend: _generate(gpt_oss_dirs["plain"], prompts, kv_cache_dtype="fp8", attention_backend=backend)
        for backend in ("torch", "triton")
    }
    for a, b in zip(runs["torch"], runs["triton"], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for lp_a, lp_b, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(lp_a[t] - lp_b[t]) < 1e-4


def test_mxfp4_dequant_matches_transformers_and_the_triton_kernel() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(3, 10, 64, generator=gen) * torch.logspace(-3, 2, 10).view(1, 10, 1)
    blocks, scales = quantize_mxfp4(weight)
    ours = torch_dequantize_mxfp4(blocks, scales, torch.float32)  # (3, 10, 64)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (ours - weight).abs().max() <= weight.abs().amax(-1, keepdim=True).max() / 4  # a 4-bit rounding
    if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        for dtype in (torch.float32, torch.bfloat16):
            out = triton_dequantize_mxfp4(blocks.to(device), scales.to(device), dtype)
            torch.testing.assert_close(out.cpu(), ours.to(dtype), rtol=0, atol=0)


def test_mxfp4_on_another_architecture_is_refused(make_checkpoint) -> None:
    from minivllm.config.model import resolve_quantization
    from tests.model_configs import llama_config

    hf = llama_config()
    hf.quantization_config = {"quant_method": "mxfp4"}
    with pytest.raises(ValueError, match="mxfp4 LlamaForCausalLM checkpoints are not supported"):
        resolve_quantization(None, hf, "LlamaForCausalLM")


CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|message|>{% endif %}"
)
"""gpt-oss's harmony framing, reduced to its role/message markers (the test tokenizer has no template)."""


def test_openai_server_chat_uses_the_checkpoint_template(gpt_oss_dirs, make_engine, tmp_path) -> None:
    import openai

    ckpt = tmp_path / "gpt-oss-chat"
    ckpt.mkdir()
    for f in gpt_oss_dirs["plain"].iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": CHAT_TEMPLATE}))
    server = make_engine(str(ckpt), dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=64)
    server = server.start_server()
    messages = [{"role": "user", "content": "def add(a, b):"}]
    tokenizer = server.harness.engine.tokenizer
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|start|>user<|message|>def add(a, b):<|end|><|start|>assistant<|message|>"
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        chat = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=6, temperature=0)
        plain = client.completions.create(model=server.model_name, prompt=ids, max_tokens=6, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text and plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids)


def test_expert_parallel_is_refused_when_the_config_is_built(gpt_oss_dirs) -> None:
    with pytest.raises(ValueError, match="parallel.enable_expert_parallel=true: gpt-oss's experts"):
        LLM(model=str(gpt_oss_dirs["plain"]), enable_expert_parallel=True)


_CPU = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize(
    "device, dtype",
    [  # not bf16 in the interpreter: its bf16 dot is wrong
        pytest.param("cpu", torch.float32, marks=_CPU, id="cpu-fp32"),
        pytest.param("cuda", torch.float32, marks=_CUDA, id="cuda-fp32"),
        pytest.param("cuda", torch.bfloat16, marks=_CUDA, id="cuda-bf16"),
    ],
)
def test_triton_fused_experts_with_biases_and_clamped_swiglu_match_the_torch_loop(device, dtype) -> None:
    """CUDA's path for gpt-oss's experts (the fused-MoE kernel with per-expert biases in both GEMMs
    and the clamped SwiGLU between them) against the torch loop, on 19 tokens over 8 experts
    (top-2): the biases and the clamp both change the result."""
    from minivllm.layers.fused_moe import route
    from minivllm.layers.fused_moe.tiles import MoeTiles
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.models.gpt_oss import GptOssExperts

    experts = GptOssExperts(gpt_oss_config())
    gen = torch.Generator().manual_seed(5)
    for p in experts.parameters():
        p.data = torch.randn(p.shape, generator=gen) * (0.5 if p.dim() == 2 else 0.25)
    T, H = 19, experts.w13.shape[-1]
    hidden = torch.randn(T, H, generator=gen)
    weights, ids = route(torch.randn(T, 8, generator=gen), experts.top_k, renormalize=True)
    experts = experts.to(device=device, dtype=dtype)
    hidden, weights, ids = hidden.to(device, dtype), weights.to(device), ids.to(device)
    expected = experts.torch_experts(hidden, weights, ids).float()
    swiglu = (experts.alpha, experts.limit)
    kw = dict(b13=experts.b13, b2=experts.b2, swiglu=swiglu)
    got = triton_fused_experts(hidden, experts.w13, experts.w2, weights, ids, **kw).float()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    split = MoeTiles(16, 32, 16, split_k=2)  # the down GEMM in two fp32 partials: its bias added once
    got = triton_fused_experts(hidden, experts.w13, experts.w2, weights, ids, tiles=split, **kw).float()
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    unbiased = triton_fused_experts(hidden, experts.w13, experts.w2, weights, ids, swiglu=swiglu).float()
    biases = dict(b13=experts.b13, b2=experts.b2)
    args = (hidden, experts.w13, experts.w2, weights, ids)
    unclamped = triton_fused_experts(*args, swiglu=(experts.alpha, 1e4), **biases).float()
    assert not torch.allclose(unbiased, expected, atol=0.1) and not torch.allclose(unclamped, expected, atol=0.1)
    with pytest.raises(ValueError, match="b2 must be"):
        triton_fused_experts(*args, b2=experts.b2[:, :-1])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kernel runs on the CPU in the interpreter")
def test_generation_with_the_fused_moe_kernel_matches_transformers(gpt_oss_dirs, reference, monkeypatch) -> None:
    """The experts through CUDA's kernel (interpreted here, as ``GptOssExperts.forward`` runs it on
    CUDA), chunked prefill with async scheduling: transformers' tokens and logprobs."""
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.models.gpt_oss import GptOssExperts

    calls = []

    def kernel(self, hidden, weights, ids):
        calls.append(len(hidden))
        swiglu = (self.alpha, self.limit)
        return triton_fused_experts(hidden, self.w13, self.w2, weights, ids, b13=self.b13, b2=self.b2, swiglu=swiglu)

    monkeypatch.setattr(GptOssExperts, "torch_experts", kernel)
    prompts, ref = reference
    outs = _generate(gpt_oss_dirs["plain"], prompts, async_scheduling=True, max_num_batched_tokens=8)
    assert calls
    _assert_matches(outs, ref["plain"])

"""``device.cpu_fused_decode``: a Llama stack's decode-only steps as one C call
(``models/llama_cpu_decode.py``). It calls the kernels the layers call, in their order, so the engine's
logprobs are the module path's bit for bit and its tokens transformers'; with the scheduler's options
around it (async scheduling, prefix caching, chunked prefill, preemption, packed weights for several
rows); and whatever it does not serve falls back or is refused with the reason."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.layers.norm import RMSNorm
from minivllm.models import llama_cpu_decode
from minivllm.quantization.cpu_panel_gemm import K_CHUNK
from tests.hf_reference import hf_greedy
from tests.model_configs import llama_config, qwen2_config, qwen3_config

pytestmark = pytest.mark.skipif(llama_cpu_decode.LIBRARY.get() is None, reason="no C compiler to build the kernels")

PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19], [8, 6, 4, 2]]
MAX_TOKENS = [10, 6, 3, 8]


def _engine(path, fused: str, **options) -> LLM:
    options = {"num_gpu_blocks_override": 32, **options}
    overrides = [f"device.cpu_fused_decode={fused}", *options.pop("overrides", [])]
    return LLM(model=str(path), dtype="float32", device="cpu", overrides=overrides, **options)


def _stack(llm: LLM):
    return llm.llm_engine.core.executor.worker.model_runner.model.model


def _run(llm: LLM, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> tuple[list[list[int]], list[list[float]], int]:
    """Tokens, the chosen tokens' logprobs, and how many steps the C stack served."""
    worker = getattr(llm.llm_engine.core.executor, "worker", None)  # None: tp=2's ranks are processes
    stack = worker.model_runner.model.model if worker is not None else None
    served = []
    if stack is not None and stack.cpu_decode is not None:
        inner = stack.cpu_decode

        def counting(*args):
            out = inner(*args)
            served.append(out is not None)
            return out

        stack.cpu_decode = counting
    params = [SamplingParams(temperature=0.0, max_tokens=n, logprobs=0, ignore_eos=True) for n in max_tokens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    return tokens, logprobs, sum(served)


@pytest.fixture(scope="module")
def reference(llama_dir):
    return [hf_greedy(llama_dir, [p], n)[0] for p, n in zip(PROMPTS, MAX_TOKENS)]


@pytest.mark.parametrize(
    "options",
    [
        {},  # one row on the plain weights; several rows fall back (the tiny layers are not packed)
        {"overrides": ["device.cpu_packed_linear=true"]},  # several rows on the panels too
        # async scheduling, prefix caching and chunked prefill (a 4-token budget splits the prompts)
        dict(
            async_scheduling=True,
            enable_prefix_caching=True,
            max_num_batched_tokens=4,
            overrides=["device.cpu_packed_linear=true"],
        ),  # fmt: skip
        # four blocks of four tokens hold the longest request alone: preempted and recomputed
        dict(block_size=4, num_gpu_blocks_override=4, overrides=["device.cpu_packed_linear=true"]),
    ],
    ids=["plain", "packed", "async-prefix-chunked", "preempted"],
)
def test_tokens_match_transformers_and_logprobs_the_module_path(llama_dir, reference, options):
    results = {}
    for fused in ("true", "false"):
        llm = _engine(llama_dir, fused, **options)
        try:
            assert (_stack(llm).cpu_decode is not None) == (fused == "true")
            results[fused] = _run(llm)
            if options.get("num_gpu_blocks_override") == 4:
                assert llm.llm_engine.scheduler_stats().num_preemptions > 0
        finally:
            llm.shutdown()
    (tokens, logprobs, served), (module_tokens, module_logprobs, _) = results["true"], results["false"]
    assert served > 0
    assert tokens == module_tokens == [t for t, _ in reference]
    packed = "device.cpu_packed_linear=true" in options.get("overrides", [])
    for got, want in zip(logprobs, module_logprobs):
        if packed:  # the same kernels in the same order: equal, not close
            assert got == want
        else:  # one row: the C stack's few-row GEMM where the unpacked layers run F.linear
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_request_is_served_every_decode_step(llama_dir):
    llm = _engine(llama_dir, "null")
    try:
        tokens, _, served = _run(llm, [PROMPTS[0]], [12])
    finally:
        llm.shutdown()
    assert served == 11  # every step after the prefill (which produced the first token)
    assert tokens == [hf_greedy(llama_dir, [PROMPTS[0]], 12)[0][0]]


def test_off_where_it_does_not_apply_and_refused_when_asked(llama_dir, opt_dir):
    llm = _engine(llama_dir, "false")
    try:
        assert _stack(llm).cpu_decode is None
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match=r"device.cpu_fused_decode=true: OPTForCausalLM does not qualify"):
        LLM(model=str(opt_dir), dtype="float32", device="cpu", overrides=["device.cpu_fused_decode=true"])
    llm = LLM(model=str(opt_dir), dtype="float32", device="cpu", num_gpu_blocks_override=16)  # null: off, quietly
    llm.shutdown()
    with pytest.raises(ValueError, match=r"device.cpu_fused_decode=true: its kernels take float32 weights"):
        LLM(model=str(llama_dir), dtype="bfloat16", device="cpu", overrides=["device.cpu_fused_decode=true"])
    with pytest.raises(ValueError, match=r"device.cpu_fused_decode=true: not with lora.enable_lora=true"):
        LLM(
            model=str(llama_dir), dtype="float32", device="cpu", enable_lora=True,
            overrides=["device.cpu_fused_decode=true"],
        )  # fmt: skip


def test_tensor_parallel_ranks_run_their_layers(llama_dir, reference):
    """tp=2: each rank's layers are shards joined by an all-reduce, which the C stack has not: off."""
    llm = _engine(llama_dir, "null", tensor_parallel_size=2)
    try:
        tokens, _, _ = _run(llm)
    finally:
        llm.shutdown()
    assert tokens == [t for t, _ in reference]


def test_why_not_names_each_layer_it_does_not_run(llama_dir):
    llm = _engine(llama_dir, "false")
    try:
        stack = _stack(llm)
        assert llama_cpu_decode.why_not(stack) is None
        attn = stack.layers[1].self_attn
        attn.q_norm = RMSNorm(attn.head_dim)
        assert "normalises q and k" in llama_cpu_decode.why_not(stack)  # a q norm without its k norm
        attn.k_norm = RMSNorm(attn.head_dim)
        assert "some of its layers normalise q and k per head" in llama_cpu_decode.why_not(stack)
        attn.q_norm = attn.k_norm = None
        attn.attn.sliding_window = 4
        assert "sliding window" in llama_cpu_decode.why_not(stack)
        attn.attn.sliding_window = None
        stack.layers[0].mlp.down_proj.weight.data = stack.layers[0].mlp.down_proj.weight.data.to(torch.bfloat16)
        assert "not float32" in llama_cpu_decode.why_not(stack)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("packed", ["false", "true"])
def test_qkv_biases_qwen2(make_checkpoint, packed):
    """Qwen2's layers are Llama's with biases on q, k and v: the C stack adds them (one row on the plain
    weights, several on the panels) and the tokens stay transformers'."""
    path = make_checkpoint("qwen2_no_window", qwen2_config(use_sliding_window=False))
    llm = _engine(path, "true", overrides=[f"device.cpu_packed_linear={packed}"])
    try:
        assert _stack(llm).layers[0].self_attn.qkv_proj.bias is not None
        tokens, _, served = _run(llm)
    finally:
        llm.shutdown()
    assert served > 0
    assert tokens == [hf_greedy(path, [p], n)[0][0] for p, n in zip(PROMPTS, MAX_TOKENS)]


@pytest.mark.parametrize("packed", ["false", "true"])
@pytest.mark.parametrize("qk_eps", [None, 3.0], ids=["checkpoint-eps", "q-k-eps-3"])
def test_per_head_q_k_norms_qwen3(make_checkpoint, packed, qk_eps):
    """Qwen3's layers are Llama's with an RMSNorm on each head of q and k before rotary: the rotary
    kernel applies them, in the modules and in the C stack alike, so the two give the same logprobs
    (equal where both run the panels) and transformers' tokens. With the q/k norms' eps set apart
    from the layer norms' (3.0, large enough to change every token's logprobs), the stack still
    gives the modules' logprobs: it passes each eps where it belongs."""
    path = make_checkpoint("qwen3", qwen3_config())
    results = {}
    for fused in ("true", "false"):
        llm = _engine(path, fused, overrides=[f"device.cpu_packed_linear={packed}"])
        try:
            stack = _stack(llm)
            assert stack.layers[0].self_attn.q_norm is not None
            if qk_eps is not None:
                for layer in stack.layers:
                    layer.self_attn.q_norm.eps = layer.self_attn.k_norm.eps = qk_eps
                if fused == "true":  # the stack reads the eps when it is attached
                    stack.cpu_decode = llama_cpu_decode.LlamaCpuDecode(stack)
            results[fused] = _run(llm)
        finally:
            llm.shutdown()
    (tokens, logprobs, served), (module_tokens, module_logprobs, _) = results["true"], results["false"]
    assert served > 0
    assert tokens == module_tokens
    if qk_eps is None:
        assert tokens == [hf_greedy(path, [p], n)[0][0] for p, n in zip(PROMPTS, MAX_TOKENS)]
    for got, want in zip(logprobs, module_logprobs):
        if packed == "true":
            assert got == want
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_wide_mlp_chunks_the_down_projection(make_checkpoint, reference):
    """An intermediate size past the panel GEMM's K_CHUNK (1024): the down projection of a several-row
    step accumulates over two chunks inside the C stack, and the tokens stay transformers'."""
    path = make_checkpoint("llama_wide_mlp", llama_config(intermediate_size=K_CHUNK + 76))
    llm = _engine(path, "true", overrides=["device.cpu_packed_linear=true"])
    try:
        tokens, _, served = _run(llm)
    finally:
        llm.shutdown()
    assert served > 0
    assert tokens == [hf_greedy(path, [p], n)[0][0] for p, n in zip(PROMPTS, MAX_TOKENS)]


def test_refused_with_a_kv_cache_not_in_float32(llama_dir):
    with pytest.raises(ValueError, match=r"device.cpu_fused_decode=true: not with cache.cache_dtype=bfloat16"):
        LLM(
            model=str(llama_dir), dtype="float32", device="cpu",
            overrides=["device.cpu_fused_decode=true", "cache.cache_dtype=bfloat16"],
        )  # fmt: skip
    llm = _engine(llama_dir, "null", overrides=["cache.cache_dtype=bfloat16"])  # null: off, quietly
    try:
        assert _stack(llm).cpu_decode is None
    finally:
        llm.shutdown()


def test_two_threads(llama_dir, reference):
    """Two intra-op threads: the kernels split their work (where it is large enough) inside the C stack."""
    llm = _engine(llama_dir, "true", overrides=["device.cpu_threads=2", "device.cpu_packed_linear=true"])
    try:
        tokens, _, served = _run(llm)
    finally:
        llm.shutdown()
    assert served > 0
    assert tokens == [t for t, _ in reference]

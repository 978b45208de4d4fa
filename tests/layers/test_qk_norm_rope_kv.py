"""The fused q/k-norm + rotary + KV-write kernel against the torch layers and the KV write
it replaces on CUDA, through Triton's interpreter on the CPU; and the layer's choice of path."""

from __future__ import annotations

import pytest
import torch

import minivllm.layers.attention as attention_layer
from minivllm import LLM, SamplingParams
from minivllm.attention.ops import write_kv
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops.qk_norm_rope_kv import qk_norm_rope_write_kv_
from minivllm.layers.rotary import RotaryEmbedding
from tests.model_configs import llama_config, qwen3_config

T, HQ, HKV, BLOCK, BLOCKS = 5, 4, 2, 4, 6
POSITIONS = [0, 3, 17, 5, 40]
SLOTS = [3, 9, -1, 0, 22]  # token 2 is padding: it writes no KV


def _reference(qkv, positions, rope, norms, slots, kv_cache):
    """The torch path: norms, rotary, then the backend's KV write."""
    q, k, v = qkv[:, :HQ], qkv[:, HQ : HQ + HKV], qkv[:, HQ + HKV :]
    q, k = (norms[0](q), norms[1](k)) if norms else (q.clone(), k.clone())
    q, k = rope(positions, q, k)
    write_kv(k.contiguous(), v.contiguous(), kv_cache, slots)
    return q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [True, False], ids=["qk-norm", "rotary-only"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 16), (16, 8), (12, 4)])
def test_fused_equals_norms_rotary_and_kv_write(head_dim, rotary_dim, neox, norm, dtype):
    torch.manual_seed(head_dim + rotary_dim)
    rope = RotaryEmbedding(head_dim, rotary_dim, {"rope_type": "default", "rope_theta": 10000.0}, neox_style=neox)
    cos, sin = rope.cos_sin(torch.arange(64))
    table = torch.cat((cos, sin), dim=-1)
    rope.cos_sin_cache = table  # the reference reads the same table the kernel does
    norms = None
    if norm:
        norms = (RMSNorm(head_dim, eps=1e-5), RMSNorm(head_dim, eps=1e-5))
        for n in norms:
            n.weight.data = (torch.rand(head_dim) + 0.5).to(dtype)
    positions, slots = torch.tensor(POSITIONS), torch.tensor(SLOTS)
    qkv = (torch.randn(T, HQ + 2 * HKV, head_dim) * 3).to(dtype)
    want_cache = torch.full((2, BLOCKS, BLOCK, HKV, head_dim), float("nan"), dtype=dtype)
    got_cache = want_cache.clone()
    want_q, want_k = _reference(qkv.clone(), positions, rope, norms, slots, want_cache)
    got = qkv.clone()
    qk_norm_rope_write_kv_(
        positions,
        got[:, :HQ],
        got[:, HQ : HQ + HKV],
        got[:, HQ + HKV :],
        table,
        neox,
        got_cache,
        slots,
        norms[0].weight if norm else None,
        norms[1].weight if norm else None,
        1e-5,
    )
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[:, :HQ], want_q, **tol)
    torch.testing.assert_close(got[:, HQ : HQ + HKV], want_k, **tol)
    torch.testing.assert_close(got[:, HQ + HKV :], qkv[:, HQ + HKV :], atol=0, rtol=0)  # v untouched
    torch.testing.assert_close(got_cache, want_cache, equal_nan=True, **tol)  # padding's slot stays NaN
    assert got_cache[1].isfinite().sum() == 4 * HKV * head_dim  # v stored bit-exactly in the 4 real slots
    torch.testing.assert_close(got_cache[1], want_cache[1], atol=0, rtol=0, equal_nan=True)


def test_fused_rejects_mismatched_inputs():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    table, slots, positions = torch.randn(16, 8), torch.tensor([0, 1]), torch.tensor([0, 1])
    cache = torch.zeros(2, 2, 4, 2, 8)
    with pytest.raises(ValueError, match="q_weight and k_weight"):
        qk_norm_rope_write_kv_(positions, q, k, v, table, True, cache, slots, torch.ones(8), None)
    with pytest.raises(ValueError, match="an fp8 cache takes write_kv"):
        qk_norm_rope_write_kv_(positions, q, k, v, table, True, cache.to(torch.float8_e4m3fn), slots)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        qk_norm_rope_write_kv_(positions, q, k, v, torch.randn(16, 10), True, cache, slots)
    with pytest.raises(ValueError, match="k and v must have one shape"):
        qk_norm_rope_write_kv_(positions, q, k, torch.randn(2, 1, 8), table, True, cache, slots)


@pytest.mark.parametrize("config", [qwen3_config, llama_config], ids=["qwen3-qk-norm", "llama-rotary-only"])
def test_layers_take_the_fused_kernel_only_where_told_and_generate_the_same(config, make_checkpoint, monkeypatch):
    """The CPU keeps the torch layers (the kernel is never called); let onto the CPU through the
    interpreter, the fused path generates the torch path's tokens with the Triton backend."""
    import minivllm.layers.ops.qk_norm_rope_kv as ops

    model_dir = make_checkpoint(f"{config.__name__}-fused-qkv", config())
    calls = []
    kernel = ops.qk_norm_rope_write_kv_
    monkeypatch.setattr(ops, "qk_norm_rope_write_kv_", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = ["def f(x):", "hello world, this is"]
    outs = []
    for devices in (attention_layer.FUSED_QKV_DEVICES, ("cuda", "cpu")):
        monkeypatch.setattr(attention_layer, "FUSED_QKV_DEVICES", devices)
        llm = LLM(model=str(model_dir), dtype="float32", num_gpu_blocks_override=32, attention_backend="triton")
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        llm.shutdown()
        assert bool(calls) == ("cpu" in devices)
    assert outs[0] == outs[1]


def test_fused_path_with_prefix_caching_chunked_prefill_and_async_scheduling(make_checkpoint, monkeypatch):
    """Through the interpreter: the fused path with cached prefix blocks (the KV written by an
    earlier request is read, never rewritten), 8-token prefill chunks, and async scheduling."""
    model_dir = make_checkpoint("qwen3_config-fused-qkv", qwen3_config())
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = ["def f(x): return x + 1", "def f(x): return x * 2"]  # a shared prefix
    outs = []
    for devices in (("cuda",), ("cuda", "cpu")):
        monkeypatch.setattr(attention_layer, "FUSED_QKV_DEVICES", devices)
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            num_gpu_blocks_override=32,
            block_size=4,
            attention_backend="triton",
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            max_num_batched_tokens=8,
            async_scheduling=True,
        )
        runs = [[o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for _ in range(2)]
        llm.shutdown()
        assert runs[0] == runs[1]  # the second run reads the first run's cached blocks
        outs.append(runs[0])
    assert outs[0] == outs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_equals_the_torch_path_on_cuda(dtype):
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    head_dim = 128
    rope = RotaryEmbedding(head_dim, head_dim, {"rope_type": "default", "rope_theta": 1e6}).to(cuda)
    cos, sin = rope.cos_sin(torch.arange(64, device=cuda))
    rope.cos_sin_cache = torch.cat((cos, sin), dim=-1)
    rope.use_triton = False  # the reference: the torch rotation over the same table
    norms = (RMSNorm(head_dim).to(cuda), RMSNorm(head_dim).to(cuda))
    for n in norms:
        n.weight.data = (torch.rand(head_dim, device=cuda) + 0.5).to(dtype)
        n.use_triton = False
    positions, slots = torch.tensor(POSITIONS, device=cuda), torch.tensor(SLOTS, device=cuda)
    qkv = torch.randn(T, HQ + 2 * HKV, head_dim, device=cuda).to(dtype)
    want_cache = torch.zeros(2, BLOCKS, BLOCK, HKV, head_dim, dtype=dtype, device=cuda)
    got_cache = want_cache.clone()
    want_q, want_k = _reference(qkv.clone(), positions, rope, norms, slots, want_cache)
    got = qkv.clone()
    qk_norm_rope_write_kv_(
        positions, got[:, :HQ], got[:, HQ : HQ + HKV], got[:, HQ + HKV :], rope.cos_sin_cache, True,
        got_cache, slots, norms[0].weight, norms[1].weight, norms[0].eps,
    )  # fmt: skip
    torch.testing.assert_close(got[:, :HQ], want_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[:, HQ : HQ + HKV], want_k, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_cache, want_cache, atol=2e-2, rtol=2e-2)

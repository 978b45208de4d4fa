"""``device.cpu_packed_linear``: oneDNN's matmul on weights reordered once at load equals F.linear to fp32
rounding, the engine with it generates transformers' tokens, in-place weight loads pack again, and
asking for it where it cannot run is refused with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.config.device import resolve_cpu_packed_linear
from minivllm.layers.embedding import ParallelLMHead
from minivllm.layers.linear import QKVParallelLinear, ReplicatedLinear
from minivllm.models.utils import MissingWeightsError, pack_cpu_weights, packed_cpu_weight_bytes
from minivllm.quantization import cpu_panel_gemm
from minivllm.quantization.base import cpu_packed_linear, pack_cpu_weight
from minivllm.quantization.cpu_panel_gemm import PANEL
from tests.hf_reference import hf_greedy

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 32, 77])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 40, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    packed = pack_cpu_weight(w)
    x = torch.randn(rows, 40, generator=gen)
    torch.testing.assert_close(cpu_packed_linear(x, packed, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, rows, 40, generator=gen)  # leading dims
    torch.testing.assert_close(cpu_packed_linear(x3, packed, b), F.linear(x3, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(40, rows, generator=gen).t()  # a non-contiguous input
    torch.testing.assert_close(cpu_packed_linear(xt, packed, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_layers_pack_and_forward_as_before():
    torch.manual_seed(0)
    qkv = QKVParallelLinear(32, 8, 4, 2, bias=True)
    head = ParallelLMHead(50, 32)
    plain = ReplicatedLinear(32, 16, bias=False)
    for m in (qkv, head, plain):
        for p in m.parameters():
            p.data.normal_()
    x = torch.randn(5, 32)
    before = [qkv(x), head.compute_logits(x), plain(x)]
    model = torch.nn.ModuleList([qkv, head, plain])
    assert pack_cpu_weights(model) == 3
    assert all(m.cpu_packed_weight is not None for m in model)
    for got, want in zip([qkv(x), head.compute_logits(x), plain(x)], before):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain.weight.data.zero_()  # what the pack holds is what forward uses
    assert plain(x).abs().max() > 0


@needs_onednn
def test_fp16_layers_are_not_packed():
    layer = ReplicatedLinear(8, 8, bias=False)
    layer.weight.data = torch.randn(8, 8).half()
    assert not layer.pack_for_cpu() and layer.cpu_packed_weight is None


def _generate(llm, prompts, max_tokens):
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens],
    )
    return [list(o.outputs[0].token_ids) for o in outs]


PACK = "device.cpu_packed_linear=true"  # every layer: the tiny checkpoints' are below the default's size


@needs_onednn
@pytest.mark.parametrize(
    "checkpoint, options",
    [
        ("llama_dir", {}),
        ("llama_tied_dir", {}),
        # async scheduling, prefix caching and chunked prefill (a 4-token budget splits the prompts)
        ("llama_dir", dict(async_scheduling=True, enable_prefix_caching=True, max_num_batched_tokens=4)),
        ("llama_dir", dict(tensor_parallel_size=2)),  # each rank packs its shard
        # four blocks of four tokens hold the longest request alone: preempted and recomputed
        ("llama_dir", dict(block_size=4, num_gpu_blocks_override=4, async_scheduling=True)),
    ],
)
def test_engine_with_packed_layers_matches_transformers(checkpoint, options, request):
    path = request.getfixturevalue(checkpoint)
    prompts, max_tokens = [[1, 5, 9, 13, 2, 7], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19]], [10, 6, 3]
    options = {"num_gpu_blocks_override": 32, **options}
    llm = LLM(model=str(path), dtype="float32", device="cpu", overrides=[PACK], **options)
    try:
        assert llm.llm_engine.cfg.cpu_packed_linear and llm.llm_engine.cfg.cpu_pack_min_weights == 0
        worker = getattr(llm.llm_engine.core.executor, "worker", None)  # None: tp=2's ranks are processes
        if worker is not None:
            packed = [
                m for m in worker.model_runner.model.modules() if getattr(m, "cpu_packed_weight", None) is not None
            ]
            assert any(isinstance(m, ParallelLMHead) for m in packed)
            assert any(isinstance(m, QKVParallelLinear) for m in packed)
        got = _generate(llm, prompts, max_tokens)
        if options["num_gpu_blocks_override"] == 4:
            assert llm.llm_engine.scheduler_stats().num_preemptions > 0
    finally:
        llm.shutdown()
    for p, n, tokens in zip(prompts, max_tokens, got):
        ((expected, _),) = hf_greedy(path, [p], n)
        assert tokens == expected


@needs_onednn
def test_in_place_weight_load_packs_again(llama_tied_dir):
    """A weight update writes the plain parameters; the packed copies (a tied head's too) follow."""
    llm = LLM(model=str(llama_tied_dir), dtype="float32", device="cpu", num_gpu_blocks_override=32, overrides=[PACK])
    try:
        model = llm.llm_engine.core.executor.worker.model_runner.model
        head = model.lm_head
        qkv = model.model.layers[0].self_attn.qkv_proj
        new_embed = torch.randn_like(model.model.embed_tokens.weight)
        new_q = torch.randn(qkv.num_heads * qkv.head_dim, qkv.linear_shape.input_size)
        with pytest.raises(MissingWeightsError):  # raised after loading the two given tensors
            model.load_weights(
                [("model.embed_tokens.weight", new_embed), ("model.layers.0.self_attn.q_proj.weight", new_q)]
            )
        x = torch.randn(3, new_embed.shape[1])
        torch.testing.assert_close(head.compute_logits(x), F.linear(x, new_embed), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qkv(x), F.linear(x, qkv.weight), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(qkv(x)[:, : new_q.shape[0]], F.linear(x, new_q), rtol=1e-4, atol=1e-4)
    finally:
        llm.shutdown()


@needs_onednn
def test_by_default_only_layers_large_enough_are_packed(llama_dir):
    llm = LLM(model=str(llama_dir), dtype="float32", device="cpu", num_gpu_blocks_override=16)
    try:
        assert llm.llm_engine.cfg.cpu_packed_linear and llm.llm_engine.cfg.cpu_pack_min_weights == 1 << 18
        model = llm.llm_engine.core.executor.worker.model_runner.model
        assert all(getattr(m, "cpu_packed_weight", None) is None for m in model.modules())  # all below 512 x 512
        assert pack_cpu_weights(model, min_weights=model.lm_head.weight.numel()) == 1  # the head alone reaches it
    finally:
        llm.shutdown()


def test_off_when_asked_and_the_refusals_name_why(llama_dir, monkeypatch):
    llm = LLM(
        model=str(llama_dir), dtype="float32", device="cpu", num_gpu_blocks_override=16,
        overrides=["device.cpu_packed_linear=false"],
    )  # fmt: skip
    try:
        model = llm.llm_engine.core.executor.worker.model_runner.model
        assert all(getattr(m, "cpu_packed_weight", None) is None for m in model.modules())
    finally:
        llm.shutdown()
    assert not resolve_cpu_packed_linear(None, "cpu", torch.float16)  # null: off where it cannot run
    assert not resolve_cpu_packed_linear(None, "cuda", torch.float32)
    with pytest.raises(ValueError, match=r"device.cpu_packed_linear=true: .*device is cuda"):
        resolve_cpu_packed_linear(True, "cuda", torch.float32)
    with pytest.raises(ValueError, match=r"device.cpu_packed_linear=true: .*not float16"):
        LLM(model=str(llama_dir), dtype="float16", device="cpu", overrides=["device.cpu_packed_linear=true"])
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match=r"no native bf16 .*AVX512-BF16"):
        resolve_cpu_packed_linear(True, "cpu", torch.bfloat16)
    assert not resolve_cpu_packed_linear(None, "cpu", torch.bfloat16)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"no oneDNN"):
        resolve_cpu_packed_linear(True, "cpu", torch.float32)


@pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU has no native bf16 for oneDNN (AVX512-BF16 / AMX)",
)
def test_bf16_packed_linear_accumulates_in_fp32(llama_dir):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 512, generator=gen).bfloat16()
    x = torch.randn(7, 512, generator=gen).bfloat16()
    got = cpu_packed_linear(x, pack_cpu_weight(w), None)
    assert got.dtype == torch.bfloat16
    exact = F.linear(x.float(), w.float())  # the products of bf16 inputs, summed in fp32
    torch.testing.assert_close(got.float(), exact, rtol=1e-2, atol=1e-1)  # one bf16 rounding of the sum
    llm = LLM(model=str(llama_dir), dtype="bfloat16", device="cpu", num_gpu_blocks_override=16, overrides=[PACK])
    try:
        assert llm.llm_engine.cfg.cpu_packed_linear
        model = llm.llm_engine.core.executor.worker.model_runner.model
        assert model.lm_head.cpu_packed_weight is not None and model.lm_head.cpu_packed_weight.dtype == torch.bfloat16
    finally:
        llm.shutdown()


@needs_onednn
def test_the_packed_copies_count_against_the_cpu_memory_budget(llama_dir, monkeypatch):
    """The KV cache gets what ``cache.cpu_memory_gb`` leaves after the weights and their packed copies."""
    from minivllm.worker import worker as worker_module

    panels_built = cpu_panel_gemm.load() is not None

    monkeypatch.setattr(worker_module, "_rss_bytes", lambda: 0)  # no activation growth: weights alone decide
    monkeypatch.setattr(worker_module, "_peak_rss_bytes", lambda: 0)
    blocks = {}
    for pack in ("true", "false"):
        llm = LLM(
            model=str(llama_dir), dtype="float32", device="cpu",
            overrides=[f"device.cpu_packed_linear={pack}", "cache.cpu_memory_gb=0.05"],
        )  # fmt: skip
        try:
            worker = llm.llm_engine.core.executor.worker
            model = worker.model_runner.model
            blocks[pack] = worker.num_blocks
            if pack == "true":
                packed = packed_cpu_weight_bytes(model)
                layers = [m for m in model.modules() if getattr(m, "cpu_packed_weight", None) is not None]
                # fp32 panels pad each layer's output features to whole panels of PANEL columns
                rows = [-(-m.weight.shape[0] // PANEL) * PANEL if panels_built else m.weight.shape[0] for m in layers]
                assert packed == sum(r * m.weight.shape[1] * 4 for r, m in zip(rows, layers)) > 0
                block_bytes = (
                    worker.model_runner.kv_caches[0].nbytes // blocks[pack] * len(worker.model_runner.kv_caches)
                )
        finally:
            llm.shutdown()
    assert blocks["false"] - blocks["true"] in (packed // block_bytes, packed // block_bytes + 1)

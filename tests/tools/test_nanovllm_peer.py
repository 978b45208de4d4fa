"""tools/peer: the flash_attn stand-in nano-vllm runs on, against plain torch attention, with
nano-vllm's cache layout and arguments; the xxhash stand-in; the peer script's parts."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tools" / "peer"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shim = _load("flash_attn_shim", PEER / "flash_attn" / "__init__.py")
xxhash_shim = _load("xxhash_shim", PEER / "fallback" / "xxhash" / "__init__.py")

H, HKV, D = 4, 2, 16


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """(Tq, H, D) queries at the last Tq of the (Tk, Hkv, D) keys: causal, bottom-right aligned."""
    tq, tk = q.shape[0], k.shape[0]
    k = k.repeat_interleave(H // HKV, dim=1).float()
    v = v.repeat_interleave(H // HKV, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    allowed = torch.arange(tk)[None, :] <= (torch.arange(tq)[:, None] + tk - tq)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _nanovllm_caches(num_layers: int, num_blocks: int, block_size: int, layer: int):
    """nano-vllm's allocation: one (2, layers, blocks, block_size, Hkv, D) tensor, a layer's caches its views."""
    kv = torch.randn(2, num_layers, num_blocks, block_size, HKV, D)
    return kv, kv[0, layer], kv[1, layer]


def test_paired_cache_is_a_view_of_nanovllm_caches():
    kv, k_cache, v_cache = _nanovllm_caches(3, 5, 4, layer=1)
    paired = shim.paired_cache(k_cache, v_cache)
    assert paired.data_ptr() == k_cache.data_ptr()  # no copy
    assert torch.equal(paired[0], k_cache) and torch.equal(paired[1], v_cache)
    apart = shim.paired_cache(k_cache.clone(), v_cache.clone())  # separate tensors: stacked
    assert torch.equal(apart, paired)


def test_varlen_prefill_over_contiguous_keys():
    torch.manual_seed(0)
    lens = [5, 1, 9]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = torch.randn(sum(lens), H, D), torch.randn(sum(lens), HKV, D), torch.randn(sum(lens), HKV, D)
    scale = 0.3
    out = shim.flash_attn_varlen_func(
        q, k, v, max_seqlen_q=9, cu_seqlens_q=cu, max_seqlen_k=9, cu_seqlens_k=cu, softmax_scale=scale, causal=True
    )
    for b in range(len(lens)):
        s, e = cu[b].item(), cu[b + 1].item()
        torch.testing.assert_close(out[s:e], _reference(q[s:e], k[s:e], v[s:e], scale), atol=1e-4, rtol=1e-4)


def test_varlen_prefill_over_the_paged_cache_with_a_cached_prefix():
    """nano-vllm's prefix-cache prefill: k/v are the layer's caches, queries the last of each sequence's keys."""
    torch.manual_seed(1)
    block_size = 4
    _, k_cache, v_cache = _nanovllm_caches(2, 8, block_size, layer=1)
    seq_k, seq_q = [7, 5], [3, 5]
    tables = torch.tensor([[6, 2], [0, 5]], dtype=torch.int32)
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 12], dtype=torch.int32)
    q = torch.randn(8, H, D)
    out = shim.flash_attn_varlen_func(
        q,
        k_cache,
        v_cache,
        max_seqlen_q=5,
        cu_seqlens_q=cu_q,
        max_seqlen_k=7,
        cu_seqlens_k=cu_k,
        softmax_scale=1 / math.sqrt(D),
        causal=True,
        block_table=tables,
    )
    for b in range(2):
        slots = [tables[b, t // block_size].item() * block_size + t % block_size for t in range(seq_k[b])]
        keys = k_cache.reshape(-1, HKV, D)[slots]
        values = v_cache.reshape(-1, HKV, D)[slots]
        rows = slice(cu_q[b].item(), cu_q[b].item() + seq_q[b])
        torch.testing.assert_close(out[rows], _reference(q[rows], keys, values, 1 / math.sqrt(D)), atol=1e-4, rtol=1e-4)


def test_decode_with_kvcache():
    torch.manual_seed(2)
    block_size = 4
    _, k_cache, v_cache = _nanovllm_caches(2, 6, block_size, layer=0)
    tables = torch.tensor([[3, 1, 0], [5, 0, 0], [2, 4, 1]], dtype=torch.int32)  # padded rows as nano-vllm pads
    seqlens = torch.tensor([9, 2, 12], dtype=torch.int32)
    q = torch.randn(3, 1, H, D)
    out = shim.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=tables, softmax_scale=0.25, causal=True
    )
    assert out.shape == (3, 1, H, D)
    for b in range(3):
        slots = [tables[b, t // block_size].item() * block_size + t % block_size for t in range(seqlens[b].item())]
        ref = _reference(q[b], k_cache.reshape(-1, HKV, D)[slots], v_cache.reshape(-1, HKV, D)[slots], 0.25)
        torch.testing.assert_close(out[b], ref, atol=1e-4, rtol=1e-4)


def test_options_it_does_not_serve_are_errors():
    q, k = torch.randn(2, H, D), torch.randn(2, HKV, D)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="causal attention only"):
        shim.flash_attn_varlen_func(q, k, k, cu, cu, 2, 2)
    with pytest.raises(NotImplementedError, match="window_size"):
        shim.flash_attn_varlen_func(q, k, k, cu, cu, 2, 2, causal=True, window_size=(4, 0))
    with pytest.raises(NotImplementedError, match=r"\['k'\]"):
        shim.flash_attn_with_kvcache(q[:, None], k, k, k=k, causal=True)


def test_xxhash_stand_in_is_a_deterministic_64_bit_hash():
    a, b = xxhash_shim.xxh64(), xxhash_shim.xxh64()
    for h in (a, b):
        h.update((7).to_bytes(8, "little"))
        h.update(b"tokens")
    assert a.intdigest() == b.intdigest() < 2**64
    c = xxhash_shim.xxh64()
    c.update(b"tokens")
    assert c.intdigest() != a.intdigest()


FAKE_BENCH = """
import os, random
import flash_attn, xxhash
assert flash_attn.__version__.endswith("minivllm-shim"), flash_attn.__file__
model = os.path.expanduser("~/huggingface/Qwen3-0.6B/")
assert os.path.isfile(os.path.join(model, "config.json")), model
random.seed(0)
prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
total = sum(random.randint(100, 1024) for _ in range(256))
print(f"Total: {total}tok, Time: 2.00s, Throughput: {total / 2:.2f}tok/s")
"""


def test_peer_runs_bench_py_with_the_stand_ins_and_reports_a_line(tmp_path, capsys):
    """A stand-in checkout whose bench.py imports what nano-vllm's does, reads the model where
    nano-vllm's does and prints its result line."""
    from tools import nanovllm_peer

    checkout = tmp_path / "nano-vllm"
    (checkout / "nanovllm").mkdir(parents=True)
    (checkout / "bench.py").write_text(FAKE_BENCH)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "peer.json"
    rc = nanovllm_peer.main(["--nanovllm", str(checkout), "--model", str(model), "--work", str(tmp_path / "w")])
    assert rc == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith(nanovllm_peer.MARK)][-1]
    record = __import__("json").loads(line.split(" ", 1)[1])
    total = nanovllm_peer.expected_total_tokens()
    assert record["status"] == "ok" and record["instance_match"] is True
    assert (record["total_tokens"], record["time_s"]) == (total, 2.0)
    assert record["output_tokens_per_s"] == pytest.approx(total / 2, abs=0.01)
    assert not out.exists()


def test_peer_without_a_checkout_says_where_to_put_one(tmp_path):
    from tools import nanovllm_peer

    with pytest.raises(SystemExit, match="not a nano-vllm checkout.*carry"):
        nanovllm_peer.main(["--nanovllm", str(tmp_path)])


def test_parse_reads_bench_py_line():
    from tools.nanovllm_peer import parse

    assert parse("x\nTotal: 133966tok, Time: 10.29s, Throughput: 13019.52tok/s\n") == {
        "total_tokens": 133966,
        "time_s": 10.29,
        "output_tokens_per_s": 13019.52,
    }
    assert parse("Traceback ...") is None


def test_random_checkpoint_loads_in_transformers_with_its_tokenizer(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tools.nanovllm_peer import build_checkpoint

    small = dict(
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=600,
    )
    out = build_checkpoint(tmp_path / "ckpt", small, device="cpu")
    config = AutoConfig.from_pretrained(out)
    assert (config.model_type, config.num_hidden_layers, config.vocab_size) == ("qwen3", 1, 600)
    assert list(out.glob("*.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.architectures == ["Qwen3ForCausalLM"]
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token_id is not None
    assert isinstance(tok.decode([5, 599, 151000]), str)  # nano-vllm decodes ids past the small vocabulary


CHECKOUT = ROOT / "third_party" / "nano-vllm"


@pytest.mark.skipif(
    not (CHECKOUT / "nanovllm").is_dir(),
    reason="no nano-vllm checkout in third_party/nano-vllm (ignored by git; docs/gpu.md says how to fetch one)",
)
def test_nanovllm_attention_layer_runs_on_the_stand_in(monkeypatch):
    """nano-vllm's own Attention layer, as its model runner drives it: a prefill of two sequences
    (keys written to the paged cache by its store kernel), then one decode step each, against
    plain attention over the same tokens."""
    import sys

    monkeypatch.setitem(sys.modules, "flash_attn", shim)
    monkeypatch.setitem(sys.modules, "xxhash", xxhash_shim)
    monkeypatch.syspath_prepend(str(CHECKOUT))
    for name in [m for m in sys.modules if m == "nanovllm" or m.startswith("nanovllm.")]:
        monkeypatch.delitem(sys.modules, name)
    from nanovllm.layers.attention import Attention
    from nanovllm.utils.context import reset_context, set_context

    torch.manual_seed(3)
    block_size, scale = 4, D**-0.5
    layer = Attention(H, D, scale, HKV)
    kv, layer.k_cache, layer.v_cache = _nanovllm_caches(2, 6, block_size, layer=1)
    kv.zero_()
    tables = torch.tensor([[4, 0], [2, 5]], dtype=torch.int32)
    lens = [6, 3]
    slots = [tables[b, t // block_size].item() * block_size + t % block_size for b in range(2) for t in range(lens[b])]
    q, k, v = torch.randn(9, H, D), torch.randn(9, HKV, D), torch.randn(9, HKV, D)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    set_context(True, cu, cu, 6, 6, torch.tensor(slots, dtype=torch.int32))
    try:
        out = layer(q, k, v)
        for b in range(2):
            rows = slice(cu[b].item(), cu[b + 1].item())
            torch.testing.assert_close(out[rows], _reference(q[rows], k[rows], v[rows], scale), atol=1e-4, rtol=1e-4)
        # decode: one new token each at positions 6 and 3, written by the layer then attended over
        qd, kd, vd = torch.randn(2, H, D), torch.randn(2, HKV, D), torch.randn(2, HKV, D)
        new_slots = torch.tensor([tables[0, 1].item() * block_size + 2, tables[1, 0].item() * block_size + 3])
        set_context(
            False,
            slot_mapping=new_slots.int(),
            context_lens=torch.tensor([7, 4], dtype=torch.int32),
            block_tables=tables,
        )
        out = layer(qd, kd, vd)
    finally:
        reset_context()
    assert out.shape == (2, 1, H, D)
    for b, (start, n) in enumerate(((0, 6), (6, 3))):
        keys = torch.cat([k[start : start + n], kd[b : b + 1]])
        values = torch.cat([v[start : start + n], vd[b : b + 1]])
        torch.testing.assert_close(out[b], _reference(qd[b : b + 1], keys, values, scale), atol=1e-4, rtol=1e-4)

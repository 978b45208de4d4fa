"""task=bench bench.baseline=llamacpp: the f32 GGUF the peer writes (checked with minivllm's
own GGUF loader and with transformers'), and the whole run against a stand-in for
``llama_cpp`` (a venv python whose ``llama_cpp`` answers llama.cpp's batched API with
transformers' model loaded from the same GGUF, checking each batch as llama.cpp would)."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.bench.llamacpp_peer import (
    GGUF_NAME,
    convert,
    gguf_path,
    gguf_tensor_name,
    read_safetensors,
    vocabulary,
)
from minivllm.cli.main import run
from minivllm.config.store import compose
from minivllm.config.task import BenchConfig
from tests.bench.test_run import _overrides
from tests.model_configs import VOCAB

FAKE_LLAMA_CPP = """
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

__version__ = "fake"
GGML_TYPE_F32 = 0
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
_state = {}


class _Params:
    pass


def llama_backend_init():
    pass


def llama_model_default_params():
    return _Params()


def llama_model_load_from_file(path, params):
    path = Path(path.decode())
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)


def llama_model_get_vocab(model):
    return model


def llama_vocab_n_tokens(vocab):
    return vocab.config.vocab_size


def llama_context_default_params():
    p = _Params()
    p.kv_unified, p.type_k, p.type_v, p.flash_attn_type = True, 1, 1, -1  # llama.cpp's: shared stream, f16 K/V, auto
    return p


class _Context:
    def __init__(self, model, params):
        assert params.n_seq_max >= 1 and not params.kv_unified and params.type_k == params.type_v == GGML_TYPE_F32
        assert params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED
        assert params.n_ubatch <= params.n_batch and params.n_threads == params.n_threads_batch
        _state["threads"] = params.n_threads
        self.model, self.params = model, params
        self.seqs, self.rows = {}, {}


def llama_init_from_model(model, params):
    return _Context(model, params)


class _Batch:
    def __init__(self, n, embd, n_seq_max):
        assert embd == 0
        self.token, self.pos, self.n_seq_id, self.logits = [0] * n, [0] * n, [0] * n, [False] * n
        self.seq_id = [[0] * n_seq_max for _ in range(n)]
        self.n_tokens = 0


def llama_batch_init(n, embd, n_seq_max):
    return _Batch(n, embd, n_seq_max)


def llama_sampler_init_greedy():
    return "greedy"


def llama_get_memory(ctx):
    return ctx


def llama_memory_clear(mem, data):
    mem.seqs.clear()


def llama_decode(ctx, batch):
    n = batch.n_tokens
    assert 0 < n <= ctx.params.n_batch
    last = {}
    for i in range(n):
        seq = batch.seq_id[i][0]
        assert batch.n_seq_id[i] == 1 and 0 <= seq < ctx.params.n_seq_max
        tokens = ctx.seqs.setdefault(seq, [])
        assert batch.pos[i] == len(tokens), "positions must continue each sequence"
        tokens.append(batch.token[i])
        assert len(tokens) <= ctx.params.n_ctx // ctx.params.n_seq_max
        last[seq] = i
    assert sorted(last) == list(range(len(last))), "consecutive sequence ids: one micro-batch a step"
    wanted = [i for i in range(n) if batch.logits[i]]
    assert sorted(last.values()) == wanted, "logits for each sequence's last token only"
    ctx.rows = {}
    with torch.no_grad():
        for i in wanted:
            tokens = ctx.seqs[batch.seq_id[i][0]][: batch.pos[i] + 1]
            ctx.rows[i] = ctx.model(torch.tensor([tokens])).logits[0, -1]
    return 0


def llama_sampler_sample(sampler, ctx, idx):
    return int(ctx.rows[idx].argmax())
"""


@pytest.fixture
def fake_peer_python(tmp_path):
    """A python that finds the stand-in ``llama_cpp`` first (the driver clears PYTHONPATH, as a real venv needs)."""
    pkg = tmp_path / "fake_site" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_LLAMA_CPP)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={pkg.parent} exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


@pytest.fixture(scope="module")
def gguf_of_llama(llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("llamacpp-gguf") / GGUF_NAME
    convert(str(llama_dir), str(out))
    return out


def test_the_converted_gguf_gives_the_checkpoints_greedy_tokens(llama_dir, gguf_of_llama):
    """minivllm's load.format=gguf on the converted file, token for token against the HF checkpoint."""
    prompts = [{"prompt_token_ids": ids} for ids in ([5, 17, 3, 99, 42], [7] * 12, list(range(30, 51)))]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def tokens(**kwargs) -> list[list[int]]:
        llm = LLM(dtype="float32", num_gpu_blocks_override=32, device="cpu", **kwargs)
        try:
            return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        finally:
            llm.shutdown()

    from_hf = tokens(model=str(llama_dir))
    from_gguf = tokens(model=str(gguf_of_llama), load_format="gguf", tokenizer=str(llama_dir))
    assert from_gguf == from_hf
    assert len({tuple(t) for t in from_hf}) > 1  # the prompts lead apart: a wrong weight would show


def test_the_converted_gguf_holds_the_weights_in_llamacpp_layout(llama_dir, gguf_of_llama):
    import gguf

    hf = read_safetensors(llama_dir / "model.safetensors")
    reader = gguf.GGUFReader(str(gguf_of_llama))
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {gguf_tensor_name(n) for n in hf}
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in tensors.values())
    down = tensors["blk.1.ffn_down.weight"]
    assert down.data.tolist() == hf["model.layers.1.mlp.down_proj.weight"].tolist()  # not permuted
    q = tensors["blk.0.attn_q.weight"].data  # (heads * head_dim, hidden), pairs interleaved
    head_dim = q.shape[0] // 4
    assert q[1].tolist() == hf["model.layers.0.self_attn.q_proj.weight"][head_dim // 2].tolist()
    fields = reader.fields
    assert fields["llama.vocab_size"].contents() == len(fields["tokenizer.ggml.tokens"].data) == VOCAB
    assert fields["llama.attention.head_count_kv"].contents() == 2


def test_the_vocabulary_is_padded_to_the_models(llama_dir):
    tokenizer = json.loads((llama_dir / "tokenizer.json").read_text())
    names, types = vocabulary(llama_dir, VOCAB + 3)
    assert len(set(names)) == VOCAB + 3 and names[-1] == f"[PAD{VOCAB + 2}]" and types[-3:] == [5, 5, 5]
    for token in tokenizer["added_tokens"]:
        assert (names[token["id"]], types[token["id"]]) == (token["content"], 3)


def test_read_safetensors_reads_half_precision(tmp_path):
    from safetensors.torch import save_file

    values = torch.tensor([[1.5, -2.25], [3.0, 0.125]])
    save_file({"a": values.to(torch.bfloat16), "b": values.to(torch.float16)}, tmp_path / "t.safetensors")
    read = read_safetensors(tmp_path / "t.safetensors")
    assert read["a"].tolist() == read["b"].tolist() == values.tolist()


def test_the_gguf_is_cached_by_checkpoint_and_mtime(llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path / "cache"))
    first = gguf_path(str(llama_dir), tmp_path / "scratch")
    assert first.is_relative_to(tmp_path / "cache") and first == gguf_path(str(llama_dir), tmp_path / "x")
    copy = tmp_path / "scratch" / "ckpt"
    copy.mkdir(parents=True)
    for file in llama_dir.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    assert gguf_path(str(copy), tmp_path / "scratch") == tmp_path / "scratch" / GGUF_NAME  # random weights: no cache
    config = copy / "config.json"
    outside = gguf_path(str(copy), tmp_path / "elsewhere")
    config.write_text(config.read_text() + " ")
    assert gguf_path(str(copy), tmp_path / "elsewhere") != outside  # a changed file is a new key


def test_llamacpp_peer_runs_the_same_requests_and_compares_tokens(llama_dir, tmp_path, fake_peer_python, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    out.mkdir()
    overrides = _overrides(
        llama_dir,
        "device=cpu",
        "device.cpu_threads=1",
        "bench.baseline=llamacpp",
        f"bench.peer_python={fake_peer_python}",
    )
    metrics = run(compose(overrides), out)
    base = metrics["baseline"]
    assert base["name"] == "llamacpp" and base["threads"] == 1
    assert base["gguf"].startswith(str(tmp_path / "cache"))
    assert base["output_tokens"] == metrics["requested_output_tokens"]  # EOS ignored, exactly max_tokens
    assert base["tokens"] == {"identical_requests": 5, "requests": 5, "first_difference_at": None}
    assert base["warmup"]["cpu_time_s"] > 0
    assert metrics["speedup_cpu_time"] == pytest.approx(base["cpu_time_s"] / metrics["cpu_time_s"])
    single = metrics["single_request"]
    assert single["decode_speedup_vs_llamacpp"] == pytest.approx(
        single["decode_tokens_per_s"] / single["llamacpp_decode_tokens_per_s"]
    )
    report = (out / "metrics.json").read_text()
    assert "token_ids" not in report and json.loads(report)["baseline"]["tokens"]["identical_requests"] == 5


def test_llamacpp_baseline_needs_a_peer_python_and_greedy():
    with pytest.raises(ValueError, match="bench.baseline=llamacpp: needs bench.peer_python.*llama-cpp-python"):
        BenchConfig(baseline="llamacpp")
    with pytest.raises(ValueError, match="bench.baseline=llamacpp: runs greedy only"):
        BenchConfig(baseline="llamacpp", peer_python="/x", temperature=0.5)
    with pytest.raises(ValueError, match="bench.baseline=llamacpp: only with bench.mode=throughput"):
        BenchConfig(baseline="llamacpp", peer_python="/x", mode="serving")


def test_a_missing_peer_python_is_named(llama_dir, tmp_path):
    overrides = _overrides(llama_dir, "device=cpu", "bench.baseline=llamacpp", f"bench.peer_python={tmp_path}/none")
    with pytest.raises(ValueError, match="bench.peer_python=.*not a python executable.*bench.baseline=llamacpp"):
        run(compose(overrides), tmp_path)


@pytest.mark.skipif(
    not os.environ.get("MINIVLLM_LLAMACPP_PYTHON"),
    reason="set MINIVLLM_LLAMACPP_PYTHON to the python of a venv with llama-cpp-python (docs/bench.md) to run it",
)
def test_the_real_llamacpp_peer_agrees_with_minivllm(llama_dir, tmp_path, monkeypatch):
    """The real llama.cpp on the converted tiny checkpoint, through its batched API: every request's
    greedy tokens equal minivllm's (fp32 both, flash attention off)."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path / "cache"))
    python = os.environ["MINIVLLM_LLAMACPP_PYTHON"]
    overrides = _overrides(
        llama_dir, "device=cpu", "device.cpu_threads=1", "bench.baseline=llamacpp", f"bench.peer_python={python}"
    )
    metrics = run(compose(overrides), tmp_path)
    base = metrics["baseline"]
    assert base["version"] != "fake" and base["output_tokens"] == metrics["requested_output_tokens"]
    assert base["tokens"] == {"identical_requests": 5, "requests": 5, "first_difference_at": None}

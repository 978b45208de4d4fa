"""The start-up memory profile runs the sampler at its widest step: ``max_num_seqs`` rows of
logits (copies of one hidden row of the profile's forward pass) with every option that
allocates (rows, vocab) on, inside the measured region (``ModelRunner.profile_run``); the
verifier's widest step too with speculative decoding, while a draft model holds its draft
distributions. A pooling runner samples nothing. Everything is observed at the sampler's and
the verifier's public methods, during the runner's public ``profile_run``."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoConfig

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.sample.metadata import ROW_PARAMS
from minivllm.sample.sampler import Sampler
from minivllm.worker.model_runner import ModelRunner
from minivllm.worker.spec_decode.verifier import DraftVerifier
from minivllm.worker.worker import Worker

SEQS = 12


def _worker(path, **kwargs) -> Worker:
    kwargs = {"max_num_seqs": SEQS, **kwargs}
    tree = config_from_kwargs(str(path), dtype="float32", max_model_len=64, block_size=16, enforce_eager=True, **kwargs)
    worker = Worker(VllmConfig.from_dictconfig(tree))
    worker.init_device()
    worker.load_model()
    return worker


def _record(monkeypatch, cls, name: str) -> list[dict]:
    """Every call of ``cls.name`` made while ``ModelRunner.profile_run`` runs (what the worker
    measures): its arguments, and the draft distributions the runner's drafter holds then."""
    calls: list[dict] = []
    running: list[ModelRunner] = []
    method, profile_run = getattr(cls, name), ModelRunner.profile_run

    def recording(self, *args):
        if running:
            drafter = running[0].drafter
            calls.append({"args": args, "held": dict(drafter.draft_probs) if drafter is not None else {}})
        return method(self, *args)

    def measured(self):
        running.append(self)
        try:
            return profile_run(self)
        finally:
            running.clear()

    monkeypatch.setattr(cls, name, recording)
    monkeypatch.setattr(ModelRunner, "profile_run", measured)
    return calls


def _check_widest_sampling(calls: list[dict], vocab: int, max_logprobs: int) -> None:
    widest = [call["args"] for call in calls if call["args"][0].shape[0] == SEQS]
    assert len(widest) == 1 and max(call["args"][0].shape[0] for call in calls) == SEQS
    logits, meta = widest[0]
    assert logits.shape == (SEQS, vocab)
    torch.testing.assert_close(logits, logits[:1].expand(SEQS, -1))  # copies of one row
    assert not meta.all_greedy and bool((meta.temperature > 0).all())
    assert all(getattr(meta, p.name) is not None for p in ROW_PARAMS)  # top-k, top-p, min-p, the penalties
    assert meta.edits.penalties.prompt_mask.shape == (SEQS, vocab)
    assert meta.edits.penalties.output_counts.shape == (SEQS, vocab)
    assert meta.edits.disallowed.shape == (SEQS, vocab)
    assert meta.max_num_logprobs == max_logprobs


@pytest.mark.parametrize("max_logprobs", [5, -1])
def test_profile_samples_max_num_seqs_rows_with_every_option(llama_dir, monkeypatch, max_logprobs):
    calls = _record(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, max_logprobs=max_logprobs)
    assert worker.determine_num_available_blocks() >= 1
    vocab = AutoConfig.from_pretrained(llama_dir).vocab_size
    _check_widest_sampling(calls, vocab, vocab if max_logprobs == -1 else max_logprobs)


def test_profile_with_lora_samples_on_the_base_model(llama_dir, monkeypatch):
    """LoRA adapts no vocabulary layer: the profile's logits need no adapter mapping."""
    calls = _record(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    assert worker.determine_num_available_blocks() >= 1
    assert worker.model_runner.lora.ctx.groups == []
    _check_widest_sampling(calls, AutoConfig.from_pretrained(llama_dir).vocab_size, 20)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_profile_verifies_k_plus_one_rows_per_request(llama_dir, monkeypatch, method):
    """A draft model's (rows, vocab) draft distributions are verified too, and held throughout
    (one (k, vocab) per sampling request, as between steps); n-gram drafts have none."""
    calls = _record(monkeypatch, DraftVerifier, "profile")
    sampled = _record(monkeypatch, Sampler, "forward")
    speculative = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "draft_model":
        speculative = {"method": "draft_model", "model": str(llama_dir)}
    worker = _worker(llama_dir, speculative_config={**speculative, "num_speculative_tokens": 3})
    assert worker.determine_num_available_blocks() >= 1
    assert len(calls) == 1
    logits, meta, k, with_draft_probs = calls[0]["args"]
    assert logits.shape[0] == SEQS * (3 + 1) and k == 3 and with_draft_probs == (method == "draft_model")
    assert meta.top_k is not None and meta.top_p is not None and not meta.all_greedy
    vocab = AutoConfig.from_pretrained(llama_dir).vocab_size
    for held in (calls[0]["held"], sampled[-1]["held"]):  # the distributions a draft model holds between steps
        assert len(held) == (SEQS if with_draft_probs else 0)
        assert all(q.shape == (3, vocab) for q in held.values())
    assert worker.model_runner.drafter is None or worker.model_runner.drafter.draft_probs == {}  # let go after


def test_pooling_profile_samples_nothing(llama_dir, monkeypatch):
    calls = _record(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, runner="pooling")
    assert worker.determine_num_available_blocks() >= 1
    assert calls == []


@pytest.mark.gpu
def test_cuda_profile_peak_includes_the_sampler(llama_dir):
    """On CUDA the profile's peak (``max_memory_allocated`` around ``profile_run``, over what was
    allocated before it) holds the sampler's (256, vocab) working set: at least the logits and one
    more copy over the profile of a pooling runner of the same model, which samples nothing (the
    forward pass, 256 tokens, stays smaller). Each is measured on its second run, after the
    kernels' first-use compilation and tuning."""
    peaks = []
    for runner in ("pooling", "generate"):
        worker = _worker(llama_dir, device="cuda", max_num_seqs=256, max_num_batched_tokens=256, runner=runner)
        worker.model_runner.prepare_profile()
        worker.model_runner.profile_run()  # warm-up
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        worker.model_runner.profile_run()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - before)
        del worker
    vocab = AutoConfig.from_pretrained(llama_dir).vocab_size
    assert peaks[1] - peaks[0] >= 2 * 256 * vocab * 4, peaks


def test_kv_cache_gives_way_to_the_mla_context_workspace(make_checkpoint, llama_dir, monkeypatch):
    """With the profile's measurement fixed, a DeepSeek V3 model's KV blocks are those of (total x
    utilization - peak - one expanded context piece - the merge's fp32 rows); the workspace grows
    with ``CONTEXT_CHUNK_TOKENS``, and a model without MLA layers reserves none."""
    from minivllm.attention import mla
    from tests.model_configs import deepseek_v3_config

    total, peak = float(256 << 20), float(8 << 20)
    monkeypatch.setattr(Worker, "_profile_memory", lambda self: (total, peak))
    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    hf = AutoConfig.from_pretrained(ckpt)
    worker = _worker(ckpt, max_num_batched_tokens=256)
    H, dn, dv, latent = (
        hf.num_attention_heads,
        hf.qk_nope_head_dim,
        hf.v_head_dim,
        hf.kv_lora_rank + hf.qk_rope_head_dim,
    )
    piece = mla.CONTEXT_CHUNK_TOKENS * (latent + H * (dn + dv)) * 4  # float32
    merge = 5 * 256 * H * (dv + 1) * 4  # fp32 outputs and log-sum-exps of the merge
    assert worker.model_runner.mla_workspace_bytes() == piece + merge
    usable = total * worker.cfg.cache.gpu_memory_utilization - peak
    per_block = worker.model_runner.kv_cache_bytes_per_block()
    assert worker.determine_num_available_blocks() == int((usable - piece - merge) // per_block)
    monkeypatch.setattr(mla, "CONTEXT_CHUNK_TOKENS", 2 * mla.CONTEXT_CHUNK_TOKENS)
    assert worker.model_runner.mla_workspace_bytes() == 2 * piece + merge
    assert _worker(llama_dir).model_runner.mla_workspace_bytes() == 0

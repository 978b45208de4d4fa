"""The start-up memory profile runs the sampler at its widest step: ``max_num_seqs`` rows of
logits (copies of one hidden row of the profile's forward pass) with every option that
allocates (rows, vocab) on, inside the measured region; the verifier's widest step too with
speculative decoding. A pooling runner samples nothing."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.verifier import DraftVerifier
from minivllm.worker import runner_profile
from minivllm.worker.model_runner import ModelRunner
from minivllm.worker.sampler_profile import held_draft_probs
from minivllm.worker.worker import Worker

SEQS = 12


def _worker(path, **kwargs) -> Worker:
    kwargs = {"max_num_seqs": SEQS, **kwargs}
    tree = config_from_kwargs(str(path), dtype="float32", max_model_len=64, block_size=16, enforce_eager=True, **kwargs)
    worker = Worker(VllmConfig.from_dictconfig(tree))
    worker.init_device()
    worker.load_model()
    return worker


def _spy(monkeypatch, cls, name: str) -> list[tuple]:
    """Every call's arguments, recorded only inside ``Worker._profile_memory`` (the measured region)."""
    calls: list[tuple] = []
    inside = [False]
    method, profile = getattr(cls, name), Worker._profile_memory

    def recording(self, *args):
        if inside[0]:
            calls.append(args)
        return method(self, *args)

    def measuring(self):
        inside[0] = True
        try:
            return profile(self)
        finally:
            inside[0] = False

    monkeypatch.setattr(cls, name, recording)
    monkeypatch.setattr(Worker, "_profile_memory", measuring)
    return calls


def _check_widest_sampling(calls: list[tuple], vocab: int, max_logprobs: int) -> None:
    widest = [(logits, meta) for logits, meta in calls if logits.shape[0] == SEQS]
    assert len(widest) == 1 and max(logits.shape[0] for logits, _ in calls) == SEQS
    logits, meta = widest[0]
    assert logits.shape == (SEQS, vocab)
    torch.testing.assert_close(logits, logits[:1].expand(SEQS, -1))  # copies of one row
    assert not meta.all_greedy and bool((meta.temperature > 0).all())
    assert meta.top_k is not None and meta.top_p is not None and meta.min_p is not None
    penalties = meta.edits.penalties
    assert penalties.repetition is not None and penalties.prompt_mask.shape == (SEQS, vocab)
    assert penalties.presence is not None and penalties.frequency is not None
    assert meta.edits.disallowed.shape == (SEQS, vocab)
    assert meta.max_num_logprobs == max_logprobs


@pytest.mark.parametrize("max_logprobs", [5, -1])
def test_profile_samples_max_num_seqs_rows_with_every_option(llama_dir, monkeypatch, max_logprobs):
    calls = _spy(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, max_logprobs=max_logprobs)
    assert worker.determine_num_available_blocks() >= 1
    vocab = AutoConfig.from_pretrained(llama_dir).vocab_size
    _check_widest_sampling(calls, vocab, vocab if max_logprobs == -1 else max_logprobs)


def test_profile_with_lora_samples_on_the_base_model(llama_dir, monkeypatch):
    """LoRA adapts no vocabulary layer: the profile's logits need no adapter mapping."""
    calls = _spy(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    assert worker.determine_num_available_blocks() >= 1
    assert worker.model_runner.lora.ctx.groups == []
    _check_widest_sampling(calls, AutoConfig.from_pretrained(llama_dir).vocab_size, 20)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_profile_verifies_k_plus_one_rows_per_request(llama_dir, monkeypatch, method):
    """A draft model's (rows, vocab) draft distributions are verified too; n-gram drafts have none."""
    calls = _spy(monkeypatch, DraftVerifier, "profile")
    held = []
    monkeypatch.setattr(
        runner_profile, "held_draft_probs", lambda cfg, device: held.append(1) or held_draft_probs(cfg, device)
    )
    speculative = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "draft_model":
        speculative = {"method": "draft_model", "model": str(llama_dir)}
    worker = _worker(llama_dir, speculative_config={**speculative, "num_speculative_tokens": 3})
    assert worker.determine_num_available_blocks() >= 1
    assert len(calls) == 1
    logits, meta, k, with_draft_probs = calls[0]
    assert logits.shape[0] == SEQS * (3 + 1) and k == 3 and with_draft_probs == (method == "draft_model")
    assert len(held) == with_draft_probs  # the distributions a draft model holds between steps
    assert meta.top_k is not None and meta.top_p is not None and not meta.all_greedy


def test_pooling_profile_samples_nothing(llama_dir, monkeypatch):
    calls = _spy(monkeypatch, Sampler, "forward")
    worker = _worker(llama_dir, runner="pooling")
    assert worker.determine_num_available_blocks() >= 1
    assert calls == []


@pytest.mark.gpu
def test_cuda_profile_peak_includes_the_sampler(llama_dir, monkeypatch):
    """On CUDA the measured peak (``max_memory_allocated``) holds the sampler's (256, vocab)
    working set: at least the logits and one more copy over a profile without it (the forward
    pass, 256 tokens, stays smaller)."""
    peaks = []
    for with_sampler in (False, True):
        if not with_sampler:
            monkeypatch.setattr(ModelRunner, "_profile_sampler", lambda self, row: None)
        else:
            monkeypatch.undo()
        worker = _worker(llama_dir, device="cuda", max_num_seqs=256, max_num_batched_tokens=256)
        peaks.append(worker._profile_memory()[1])
        del worker
        torch.cuda.empty_cache()
    vocab = AutoConfig.from_pretrained(llama_dir).vocab_size
    assert peaks[1] - peaks[0] >= 2 * 256 * vocab * 4

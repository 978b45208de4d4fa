"""The fused Triton sampler (in Triton's interpreter, tiny vocabularies) against the torch path:
the same distributions (chi-square, as tests/sample/test_sampler.py), the same greedy tokens
(ties: the first largest entry), and seeded rows that draw the same tokens whatever the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.config.device import resolve_fused_sampler
from minivllm.sample.logits_processors import LogitsEdits, TokenHistory
from minivllm.sample.sampler import Sampler
from minivllm.sample.triton_sampler import MAX_BLOCK, fused_sample
from minivllm.sampling_params import SamplingParams
from tests.sample.helpers import sampling_metadata
from tests.sample.test_sampler import CASES, LOGITS, V, _chi_square_p, _kept_probs

CPU = torch.device("cpu")


def _fused_draw(params: SamplingParams, num: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    meta = sampling_metadata([params] * num)
    sampler = Sampler(torch.Generator().manual_seed(seed), fused=True)
    return sampler(LOGITS.to(dtype).expand(num, V).contiguous(), meta).token_ids


@pytest.mark.parametrize("name", CASES)
def test_fused_masks_never_leak_and_kept_tokens_follow_the_renormalised_softmax(name):
    params, kept_fn = CASES[name]
    kept = kept_fn()
    counts = torch.bincount(_fused_draw(params, 6_000), minlength=V)
    assert counts[~kept].sum() == 0, f"{name} emitted tokens outside the allowed set"
    assert _chi_square_p(counts, _kept_probs(kept)) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_temperature_frequencies_match_the_softmax(dtype):
    counts = torch.bincount(_fused_draw(SamplingParams(temperature=0.7), 8_000, seed=3, dtype=dtype), minlength=V)
    logits = LOGITS.to(dtype).float()  # the kernel reads the logits in their dtype
    expected = (logits / 0.7).softmax(-1)
    assert _chi_square_p(counts, expected) > 1e-3
    assert _chi_square_p(counts, logits.softmax(-1)) < 1e-6  # the test tells temperatures apart


def test_fused_truncated_and_plain_rows_in_one_batch_each_follow_their_own_distribution():
    """Rows asking for top-k take the masked path, the others the plain one, interleaved."""
    params = [SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.0)] * 3_000
    meta = sampling_metadata(params)
    assert meta.truncated_rows.tolist() == list(range(0, 6_000, 2))
    tokens = Sampler(torch.Generator().manual_seed(7), fused=True)(LOGITS.expand(6_000, V).contiguous(), meta)
    top_k = torch.bincount(tokens.token_ids[0::2], minlength=V)
    plain = torch.bincount(tokens.token_ids[1::2], minlength=V)
    kept = CASES["top_k"][1]()
    assert top_k[~kept].sum() == 0 and plain[~kept].sum() > 0
    assert _chi_square_p(top_k, _kept_probs(kept)) > 1e-3
    assert _chi_square_p(plain, _kept_probs(torch.ones(V, dtype=torch.bool))) > 1e-3


def test_greedy_rows_have_no_truncated_rows():
    meta = sampling_metadata([SamplingParams(temperature=0, top_k=3), SamplingParams(temperature=1.0)])
    assert meta.truncated_rows is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_greedy_is_torch_argmax_with_ties_and_inf_across_blocks(dtype):
    """Ties inside a block and across blocks (V > MAX_BLOCK), -inf entries and an all -inf row."""
    g = torch.Generator().manual_seed(0)
    vocab = MAX_BLOCK + 37
    logits = torch.randint(0, 3, (6, vocab), generator=g).to(dtype)
    logits[torch.rand(6, vocab, generator=g) < 0.1] = float("-inf")
    logits[1, :] = 0.0
    logits[1, [5, MAX_BLOCK + 3]] = 4.0  # a tie across blocks: the first wins
    logits[2, :] = float("-inf")
    logits[3, MAX_BLOCK + 30] = float("inf")
    temperature = torch.zeros(6)
    keys = torch.zeros(6, dtype=torch.int64)
    got = fused_sample(logits, temperature, keys, keys)
    assert torch.equal(got, logits.float().argmax(dim=-1))
    assert got[1].item() == 5 and got[2].item() == 0


def test_fused_greedy_rows_in_a_mixed_batch_and_after_penalties():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0)]
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    out = Sampler(torch.Generator().manual_seed(0), fused=True)(logits, sampling_metadata(params))
    assert out.token_ids[[0, 2]].tolist() == logits[[0, 2]].argmax(-1).tolist()
    logits = torch.zeros(1, V)
    logits[0, 4], logits[0, 9] = 2.0, 1.5
    params = [SamplingParams(temperature=0, frequency_penalty=1.0)]
    meta = sampling_metadata(params)
    meta.edits = LogitsEdits.build(params, TokenHistory([[0, 4, 4]], [1]), V, CPU)
    assert Sampler(fused=True)(logits, meta).token_ids.item() == 9  # 2.0 - 2 < 1.5


def test_fused_logprobs_are_the_torch_paths():
    params = [SamplingParams(temperature=0, logprobs=3), SamplingParams(temperature=0.8, logprobs=2)]
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(2))
    fused = Sampler(torch.Generator().manual_seed(0), fused=True)(logits, sampling_metadata(params))
    chosen = logits.log_softmax(-1).gather(1, fused.token_ids.unsqueeze(1)).squeeze(1)
    assert torch.allclose(fused.logprobs[:, 0], chosen)
    assert fused.logprob_token_ids[0, 0] == logits[0].argmax() and fused.logprob_token_ids[0, 0] == fused.token_ids[0]
    assert fused.logprob_token_ids[:, 1:].tolist() == logits.topk(3, dim=-1).indices.tolist()


def _seeded_token(seed: int, others: list[SamplingParams], position: int) -> int:
    """A seeded row at ``position`` among ``others`` (own logits, own generators), fused."""
    params = list(others)
    params.insert(position, SamplingParams(temperature=0.9, top_p=0.9, seed=seed))
    gens = {row: torch.Generator().manual_seed(p.seed) for row, p in enumerate(params) if p.seed is not None}
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(100 + len(others)))
    logits[position] = LOGITS
    meta = sampling_metadata(params)
    meta.generators = gens
    sampler = Sampler(torch.Generator().manual_seed(len(others)), fused=True)
    sampler.num_fused_steps = len(others)  # the engine's step count does not matter either
    return sampler(logits, meta).token_ids[position].item()


def test_fused_seeded_row_ignores_batch_composition_and_position():
    batches = [
        ([], 0),
        ([SamplingParams(temperature=1.0)] * 3, 2),
        ([SamplingParams(temperature=0), SamplingParams(temperature=1.2, top_k=3, seed=9)], 1),
        ([SamplingParams(temperature=0.5, min_p=0.1)] * 70, 66),  # another program of rows
    ]
    seeds = range(40)
    reference = [_seeded_token(s, [], 0) for s in seeds]
    assert len(set(reference)) > 3  # the seeds matter
    for others, position in batches:
        assert [_seeded_token(s, others, position) for s in seeds] == reference


def test_unseeded_rows_draw_new_noise_every_step():
    meta = sampling_metadata([SamplingParams(temperature=1.0)] * 64)
    sampler = Sampler(torch.Generator().manual_seed(0), fused=True)
    logits = torch.zeros(64, V)
    first, second = sampler(logits, meta).token_ids, sampler(logits, meta).token_ids
    assert not torch.equal(first, second)
    assert len(set(first.tolist())) > 10  # rows differ from each other too


def test_wrapper_refuses_bad_inputs():
    logits, temp, keys = torch.zeros(2, V), torch.zeros(2), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="logits dtype"):
        fused_sample(logits.double(), temp, keys, keys)
    with pytest.raises(ValueError, match="temperature must be"):
        fused_sample(logits, torch.zeros(3), keys, keys)
    with pytest.raises(ValueError, match="unit stride"):
        fused_sample(torch.zeros(V, 2).t(), temp, keys, keys)
    with pytest.raises(ValueError, match="masked and masked_rows"):
        fused_sample(logits, temp, keys, keys, masked=logits)
    with pytest.raises(ValueError, match="masked must be"):
        fused_sample(logits, temp, keys, keys, torch.zeros(1, V + 1), torch.full((2,), -1, dtype=torch.int32))


def test_fused_sampler_follows_the_device_and_needs_the_interpreter_on_the_cpu(monkeypatch):
    assert resolve_fused_sampler(None, "cuda") is True
    assert resolve_fused_sampler(None, "cpu") is False
    assert resolve_fused_sampler(False, "cuda") is False
    assert resolve_fused_sampler(True, "cpu") is True  # TRITON_INTERPRET=1 (tests/conftest.py)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="compilation.fused_sampler"):
        resolve_fused_sampler(True, "cpu")


@pytest.mark.parametrize("value, expected", [("null", False), ("true", True), ("false", False)])
def test_the_config_carries_the_resolved_choice_to_the_runner(llama_dir, value, expected):
    from minivllm.config.store import build_config

    cfg = build_config([f"model.path={llama_dir}", "device=cpu", f"compilation.fused_sampler={value}"])
    assert cfg.fused_sampler is expected


def test_truncated_rows_follow_the_rows_asked_for():
    meta = sampling_metadata([SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, min_p=0.1)])
    assert isinstance(meta.truncated_rows, np.ndarray) and meta.truncated_rows.tolist() == [1]


# ---- the engine with compilation.fused_sampler=true (the kernel interpreted) ----------------

PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "for line in open(path):\n"]


def _engine(llama_dir, fused: bool, **kwargs):
    from minivllm import LLM

    overrides = [f"compilation.fused_sampler={str(fused).lower()}", "cache.enable_prefix_caching=true"]
    return LLM(
        model=str(llama_dir), dtype="float32", block_size=4, max_num_batched_tokens=16, overrides=overrides, **kwargs
    )


def test_engine_greedy_tokens_are_the_torch_samplers(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for fused in (False, True):
        llm = _engine(llama_dir, fused)
        outs[fused] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        llm.shutdown()
    assert outs[True] == outs[False]


def test_engine_seeded_request_gives_the_same_tokens_alone_and_in_any_batch(llama_dir):
    """Chunked prefill (16-token budget) and prefix caching on; the seeded request rides alone,
    then beside greedy, unseeded and other seeded requests, at another row."""
    llm = _engine(llama_dir, True)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_tokens=12, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=5, seed=9, max_tokens=6),
    ]
    batch = llm.generate([*PROMPTS, PROMPTS[0]], [*others, seeded], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone
    unseeded = llm.generate(
        [PROMPTS[0]] * 2, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids  # rows draw their own noise
    llm.shutdown()


def test_engine_tp2_samples_the_tp1_tokens(llama_dir):
    """Two worker processes run the kernel on the same logits; the first rank's tokens are kept."""
    params = [SamplingParams(temperature=0, max_tokens=6), SamplingParams(temperature=0.8, seed=4, max_tokens=6)]
    outs = {}
    for tp in (1, 2):
        llm = _engine(llama_dir, True, tensor_parallel_size=tp)
        try:
            outs[tp] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], params, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert outs[2] == outs[1]

"""Benchmark workloads and the bench config: lengths, seeds, prefixes, JSONL, bad values."""

from __future__ import annotations

import json
import random

import pytest

from minivllm.bench.run import _params
from minivllm.bench.workloads import BenchRequest, build_workload, nanovllm_instance, write_jsonl
from minivllm.config.task import BenchConfig


def test_random_workload_respects_ranges_and_seed():
    cfg = BenchConfig(num_prompts=50, min_input_len=5, max_input_len=9, min_output_len=2, max_output_len=3, seed=7)
    reqs = build_workload(cfg, vocab_size=100, max_model_len=64)
    assert len(reqs) == 50
    assert {len(r.prompt_token_ids) for r in reqs} <= set(range(5, 10))
    assert {r.max_tokens for r in reqs} == {2, 3}  # both ends of the inclusive range are drawn
    assert all(0 <= t < 100 for r in reqs for t in r.prompt_token_ids)
    assert build_workload(cfg, 100, 64) == reqs
    other = build_workload(BenchConfig(**{**cfg.__dict__, "seed": 8}), 100, 64)
    assert other != reqs


def test_shared_prefix_workload_shares_prefixes():
    cfg = BenchConfig(
        workload="shared_prefix", num_prompts=6, prefix_len=10, num_prefixes=2, min_input_len=3, max_input_len=4
    )
    reqs = build_workload(cfg, vocab_size=1000, max_model_len=512)
    prefixes = [tuple(r.prompt_token_ids[:10]) for r in reqs]
    assert prefixes[0] == prefixes[2] == prefixes[4]
    assert prefixes[1] == prefixes[3] == prefixes[5]
    assert prefixes[0] != prefixes[1]
    assert all(13 <= len(r.prompt_token_ids) <= 14 for r in reqs)


def test_jsonl_workload(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt_token_ids": [1, 2, 3], "max_tokens": 4}, {"prompt": "a b"}, {"prompt": "c", "max_tokens": 2}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    cfg = BenchConfig(workload="jsonl", prompts_file=str(path), num_prompts=10, min_output_len=5, max_output_len=5)
    reqs = build_workload(cfg, 100, 64, encode=lambda text: [ord(c) % 100 for c in text])
    assert [r.prompt_token_ids for r in reqs] == [[1, 2, 3], [97, 32, 98], [99]]
    assert [r.max_tokens for r in reqs] == [4, 5, 2]
    assert len(build_workload(BenchConfig(**{**cfg.__dict__, "num_prompts": 2}), 100, 64, encode=lambda t: [1])) == 2


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_token_ids": [1]}\n{"text": "x"}\n')
    cfg = BenchConfig(workload="jsonl", prompts_file=str(path))
    with pytest.raises(ValueError, match=r"p.jsonl:2 needs a 'prompt' or 'prompt_token_ids'"):
        build_workload(cfg, 100, 64)
    with pytest.raises(ValueError, match="no such file"):
        build_workload(BenchConfig(workload="jsonl", prompts_file=str(tmp_path / "nope.jsonl")), 100, 64)


def test_workload_longer_than_max_model_len_fails_before_work():
    cfg = BenchConfig(min_input_len=40, max_input_len=40, min_output_len=30, max_output_len=30)
    with pytest.raises(ValueError, match="max_model_len=64"):
        build_workload(cfg, 100, max_model_len=64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workload": "zipf"}, "bench.workload='zipf': must be one of random, shared_prefix, jsonl"),
        ({"baseline": "tgi"}, "bench.baseline='tgi': must be one of none, hf, vllm, llamacpp"),
        ({"baseline": "vllm"}, "bench.baseline=vllm: needs bench.peer_python"),
        ({"min_input_len": 10, "max_input_len": 5}, "bench.max_input_len=5: must be at least bench.min_input_len=10"),
        ({"num_prompts": 0}, r"bench.num_prompts=0: must be in \[1, inf\)"),
        ({"hf_batch_size": 0}, r"bench.hf_batch_size=0"),
        ({"workload": "jsonl"}, "bench.workload=jsonl: needs bench.prompts_file"),
    ],
)
def test_bad_bench_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**kwargs)


def _nanovllm_bench_py_instance() -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py, as it draws: the global ``random`` seeded with 0, the prompts (each
    length drawn before its ids), then the max_tokens. The global state is restored after."""
    state = random.getstate()
    try:
        random.seed(0)
        prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
        max_tokens = [random.randint(100, 1024) for _ in range(256)]
    finally:
        random.setstate(state)
    return prompts, max_tokens


def test_nanovllm_instance_is_bench_py_draw_for_draw():
    prompts, max_tokens = _nanovllm_bench_py_instance()
    state = random.getstate()
    instance = nanovllm_instance()
    assert random.getstate() == state  # its own generator: the caller's random state is untouched
    assert [r.prompt_token_ids for r in instance] == prompts
    assert [r.max_tokens for r in instance] == max_tokens
    assert {(r.temperature, r.ignore_eos) for r in instance} == {(0.6, True)}


def test_nanovllm_instance_replays_through_jsonl(tmp_path):
    path = tmp_path / "nanovllm.jsonl"
    write_jsonl(nanovllm_instance(), path)
    prompts, max_tokens = _nanovllm_bench_py_instance()
    # the lengths the file holds would be drawn differently: every line must carry its own
    cfg = BenchConfig(workload="jsonl", prompts_file=str(path), num_prompts=256, min_output_len=1, max_output_len=1)
    reqs = build_workload(cfg, vocab_size=151936, max_model_len=4096)
    assert [r.prompt_token_ids for r in reqs] == prompts
    assert [r.max_tokens for r in reqs] == max_tokens
    params = [_params(r, temperature=0.0) for r in reqs]
    assert {(p.temperature, p.ignore_eos) for p in params} == {(0.6, True)}


def test_jsonl_lines_set_temperature_and_ignore_eos(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt_token_ids": [1], "max_tokens": 3, "temperature": 0.5, "ignore_eos": False},
        {"prompt_token_ids": [2], "max_tokens": 3},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    reqs = build_workload(BenchConfig(workload="jsonl", prompts_file=str(path)), 100, 64)
    assert [(r.temperature, r.ignore_eos) for r in reqs] == [(0.5, False), (None, True)]
    first, second = (_params(r, temperature=0.9) for r in reqs)
    assert (first.temperature, first.ignore_eos, first.max_tokens) == (0.5, False, 3)
    assert (second.temperature, second.ignore_eos) == (0.9, True)


def test_write_jsonl_round_trips(tmp_path):
    path = tmp_path / "r.jsonl"
    reqs = [BenchRequest([5, 6], 2), BenchRequest([7], 4, temperature=1.0, ignore_eos=False)]
    write_jsonl(reqs, path)
    cfg = BenchConfig(workload="jsonl", prompts_file=str(path), min_output_len=9, max_output_len=9)
    assert build_workload(cfg, 100, 64) == reqs

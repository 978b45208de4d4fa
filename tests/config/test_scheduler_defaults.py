"""The batch limits' nulls resolve once, per device and entry point: the CPU keeps
64 requests / 2,048 tokens, CUDA takes vLLM-like limits that stay within the
captured CUDA graphs; explicit values win, and errors still name the key."""

from __future__ import annotations

import logging

import pytest

from minivllm.config import build_config
from minivllm.config.device import CompilationConfig, capture_sizes
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.scheduler import SchedulerConfig, default_limits, resolve_batch_limits
from minivllm.config.vllm_config import VllmConfig

LIMITS = ("max_num_seqs", "max_num_batched_tokens")


@pytest.fixture
def on_cuda(monkeypatch):
    """Build configs as on a CUDA machine (no GPU needed: the config only names the device)."""
    monkeypatch.setattr("minivllm.config.vllm_config.resolve_device", lambda requested: "cuda")


def limits(cfg) -> tuple[int, int]:
    return cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens


@pytest.mark.parametrize("task", ["generate", "bench", "serve"])
def test_cpu_defaults_are_unchanged_for_every_entry_point(task, llama_dir):
    assert SchedulerConfig().max_num_seqs is None and SchedulerConfig().max_num_batched_tokens is None
    cfg = build_config([f"model.path={llama_dir}", "device=cpu", f"task={task}"])
    assert limits(cfg) == (64, 2048)
    assert cfg.defaulted_scheduler_keys == ["scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"]


def test_cuda_defaults_are_larger_and_fit_the_captured_graphs():
    cpu, offline, serve = (
        default_limits("cpu", "generate"),
        default_limits("cuda", "generate"),
        default_limits("cuda", "serve"),
    )
    assert default_limits("cuda", "bench") == offline
    assert offline.max_num_seqs == serve.max_num_seqs > cpu.max_num_seqs
    assert offline.max_num_batched_tokens > serve.max_num_batched_tokens >= cpu.max_num_batched_tokens
    # every decode batch a null limit admits pads up to a graph the default capture list holds
    assert capture_sizes(CompilationConfig().cudagraph_capture_sizes, offline.max_num_seqs)[-1] == offline.max_num_seqs


@pytest.mark.parametrize("task", ["generate", "serve"])
def test_vllm_config_resolves_cuda_nulls_once(task, llama_dir, on_cuda):
    cfg = build_config([f"model.path={llama_dir}", f"task={task}"])
    want = default_limits("cuda", task)
    assert cfg.device_type == "cuda" and cfg.async_scheduling  # the CUDA path of the other device nulls
    assert limits(cfg) == (want.max_num_seqs, want.max_num_batched_tokens)
    assert isinstance(cfg.scheduler, SchedulerConfig)
    saved = cfg.to_dictconfig().scheduler  # what resolved_config.yaml shows
    assert (saved.max_num_seqs, saved.max_num_batched_tokens) == limits(cfg)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_explicit_values_win(device, llama_dir, monkeypatch):
    if device == "cuda":
        monkeypatch.setattr("minivllm.config.vllm_config.resolve_device", lambda requested: "cuda")
    cfg = build_config([f"model.path={llama_dir}", "scheduler.max_num_seqs=3", "scheduler.max_num_batched_tokens=96"])
    assert limits(cfg) == (3, 96) and cfg.defaulted_scheduler_keys == []
    only_seqs = build_config([f"model.path={llama_dir}", "scheduler.max_num_seqs=5"])
    assert limits(only_seqs) == (5, default_limits(cfg.device_type, "generate").max_num_batched_tokens)
    assert only_seqs.defaulted_scheduler_keys == ["scheduler.max_num_batched_tokens"]


def test_resolving_leaves_the_requested_config_alone():
    requested = SchedulerConfig(max_num_seqs=7)
    resolved, defaulted = resolve_batch_limits(requested, "cuda", "serve", max_model_len=4096)
    assert (requested.max_num_seqs, requested.max_num_batched_tokens) == (7, None)
    assert (resolved.max_num_seqs, resolved.max_num_batched_tokens) == (
        7,
        default_limits("cuda", "serve").max_num_batched_tokens,
    )
    assert defaulted == ["scheduler.max_num_batched_tokens"]


def test_llm_keywords_set_the_limits(llama_dir):
    cfg = VllmConfig.from_dictconfig(
        config_from_kwargs(model=str(llama_dir), device="cpu", max_num_seqs=9, max_num_batched_tokens=40)
    )
    assert limits(cfg) == (9, 40)
    with pytest.raises(ValueError, match=r"scheduler\.max_num_seqs"):
        VllmConfig.from_dictconfig(config_from_kwargs(model=str(llama_dir), device="cpu", max_num_seqs=0))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_without_chunked_prefill_a_null_budget_covers_max_model_len(device, llama_dir, monkeypatch):
    """As in vLLM: chunked prefill off and no budget given means a whole prompt a step, so a
    context longer than the device's default budget still builds; an explicit budget below
    max_model_len fails naming the key."""
    if device == "cuda":
        monkeypatch.setattr("minivllm.config.vllm_config.resolve_device", lambda requested: "cuda")
    budget = default_limits(device, "serve").max_num_batched_tokens
    overrides = [
        f"model.path={llama_dir}",
        "task=serve",
        "scheduler.enable_chunked_prefill=false",
        f"+model.hf_overrides.max_position_embeddings={2 * budget}",
    ]
    cfg = build_config(overrides)
    assert cfg.max_model_len == 2 * budget and limits(cfg)[1] == 2 * budget
    assert "scheduler.max_num_batched_tokens" in cfg.defaulted_scheduler_keys
    short = build_config([*overrides[:3], "+model.hf_overrides.max_position_embeddings=64"])
    assert limits(short)[1] == budget  # the default already covers a short context
    with pytest.raises(ValueError, match=rf"scheduler\.max_num_batched_tokens={budget} is smaller than"):
        build_config([*overrides, f"scheduler.max_num_batched_tokens={budget}"])
    chunked = build_config([*overrides[:2], overrides[3]])
    assert limits(chunked)[1] == budget  # chunked prefill keeps the device's budget


def test_a_draft_model_copies_the_targets_resolved_limits(llama_dir, on_cuda):
    cfg = build_config([f"model.path={llama_dir}", "speculative.method=draft_model", f"speculative.model={llama_dir}"])
    assert cfg.draft_config is not None and limits(cfg.draft_config) == limits(cfg)
    want = default_limits("cuda", "generate")
    assert limits(cfg) == (want.max_num_seqs, want.max_num_batched_tokens)


def test_the_engine_logs_the_resolved_limits(llama_dir, caplog):
    from minivllm.engine.llm_engine import LLMEngine

    keys = [f"model.path={llama_dir}", "device=cpu", "cache.num_gpu_blocks_override=8", "scheduler.max_num_seqs=5"]
    with caplog.at_level(logging.INFO, logger="minivllm.engine.core"):
        LLMEngine(build_config(keys)).shutdown()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Scheduler:"))
    assert "up to 5 requests and 2048 tokens a step" in line
    assert "scheduler.max_num_batched_tokens null: the cpu default" in line and "max_num_seqs null" not in line

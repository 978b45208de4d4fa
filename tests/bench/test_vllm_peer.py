"""task=bench bench.baseline=vllm against a stand-in for vLLM: a venv python whose ``vllm``
generates greedily with transformers, so the report's token comparison has a true answer."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from minivllm.bench.vllm_peer import token_agreement
from minivllm.cli.main import run
from minivllm.config.store import compose
from tests.bench.test_run import _overrides

FAKE_VLLM = """
import os
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

__version__ = "fake-bind-" + os.environ["VLLM_CPU_OMP_THREADS_BIND"] + "-mp-" + os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]


class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos, detokenize, seed):
        assert temperature == 0 and ignore_eos and not detokenize
        self.max_tokens = max_tokens


class LLM:
    def __init__(self, model, dtype, skip_tokenizer_init, kv_cache_memory_bytes, **engine_args):
        assert skip_tokenizer_init and dtype == "float32" and kv_cache_memory_bytes > 0
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)

    def generate(self, prompts, params, use_tqdm):
        outs = []
        for prompt, p in zip(prompts, params):
            ids = torch.tensor([prompt["prompt_token_ids"]])
            with torch.no_grad():
                full = self.model.generate(ids, max_new_tokens=p.max_tokens, min_new_tokens=p.max_tokens, do_sample=False)
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=full[0, ids.shape[1]:].tolist())]))
        return outs
"""


@pytest.fixture
def fake_peer_python(tmp_path):
    """A python that finds the stand-in ``vllm`` first (the driver clears PYTHONPATH, as a real venv needs)."""
    pkg = tmp_path / "fake_site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={pkg.parent} exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def test_vllm_peer_runs_the_same_requests_and_compares_tokens(llama_dir, tmp_path, fake_peer_python, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    out = tmp_path / "run"
    out.mkdir()
    overrides = _overrides(
        llama_dir, "device=cpu", "device.cpu_threads=1", "bench.baseline=vllm", f"bench.peer_python={fake_peer_python}"
    )
    metrics = run(compose(overrides), out)
    base = metrics["baseline"]
    assert base["name"] == "vllm" and base["version"] == "fake-bind-0-mp-0"  # one thread, engine in-process
    assert base["output_tokens"] == metrics["requested_output_tokens"]
    assert base["tokens"] == {"identical_requests": 5, "requests": 5, "first_difference_at": None}
    assert base["warmup"]["cpu_time_s"] > 0  # it warmed up on the rehearsal too, timed apart
    assert metrics["speedup_output_tokens_per_s"] == pytest.approx(
        metrics["output_tokens_per_s"] / base["output_tokens_per_s"]
    )
    single = metrics["single_request"]
    assert single["decode_speedup_vs_vllm"] == pytest.approx(
        single["decode_tokens_per_s"] / single["vllm_decode_tokens_per_s"]
    )
    assert "token_ids" not in json.dumps(metrics)  # compared, not stored


def test_a_failing_peer_reports_its_error(llama_dir, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'No module named vllm' >&2\nexit 3\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    overrides = _overrides(llama_dir, "device=cpu", "bench.baseline=vllm", f"bench.peer_python={python}")
    with pytest.raises(RuntimeError, match="exit code 3:\nNo module named vllm"):
        run(compose(overrides), tmp_path)


def test_token_agreement_finds_the_first_difference():
    assert token_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == {
        "identical_requests": 1,
        "requests": 2,
        "first_difference_at": 1,
    }

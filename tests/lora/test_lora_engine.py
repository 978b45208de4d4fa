"""LoRA in the engine: prefix caching per adapter, the scheduler's cap, bad adapters and config."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm import SamplingParams
from minivllm.engine.processor import Processor
from minivllm.entrypoints.llm import LLM
from minivllm.lora import LoRARequest
from minivllm.pooling.params import PoolingParams
from tests.lora.adapters import make_adapter

PARAMS = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(llama_dir, root / f"a{i}", rank=4, alpha=8, seed=20 + i) for i in range(2)]


@pytest.fixture(scope="module")
def llm(llama_dir):
    llm = LLM(
        str(llama_dir),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=64,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    yield llm
    llm.shutdown()


def _run(llm, prompt, lora):
    engine = llm.llm_engine
    before = engine.scheduler_stats().prefix_cache_hits
    out = llm.generate([prompt], PARAMS, use_tqdm=False, lora_request=lora)
    return engine.scheduler_stats().prefix_cache_hits - before, list(out[0].outputs[0].token_ids)


def test_prefix_cache_never_shared_across_adapters(llm, adapters):
    prompt = {"prompt_token_ids": list(range(10, 30))}  # 20 tokens: 4 full blocks hit on a repeat
    a, b = (LoRARequest(f"p{i}", 11 + i, str(p)) for i, p in enumerate(adapters))
    hits_a, tokens_a = _run(llm, prompt, a)
    assert hits_a == 0
    assert _run(llm, prompt, b)[0] == 0  # same tokens, other adapter
    assert _run(llm, prompt, None)[0] == 0  # the base model
    assert _run(llm, prompt, a) == (16, tokens_a)


def _broken(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return str(dst)


def _write_config(folder, **changes):
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, **changes}))


def _bad_shape(folder):
    tensors = load_file(folder / "adapter_model.safetensors")
    key = next(k for k in tensors if "q_proj.lora_B" in k)
    tensors[key] = torch.zeros(3, tensors[key].shape[1])
    save_file(tensors, folder / "adapter_model.safetensors")


def _unknown_module(folder):
    tensors = load_file(folder / "adapter_model.safetensors")
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[key.replace("q_proj", "lm_proj")] = tensors[key].clone()
    save_file(tensors, folder / "adapter_model.safetensors")


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: _write_config(d, r=16), "rank r=16 is above lora.max_lora_rank=8"),
        (lambda d: (d / "adapter_model.safetensors").unlink(), "missing adapter_model.safetensors"),
        (lambda d: (d / "adapter_config.json").unlink(), "missing adapter_config.json"),
        (_bad_shape, r"q_proj.lora_B has shape \(3, 4\), expected \(64, 4\)"),
        (_unknown_module, "target module 'lm_proj' is not supported"),
        (lambda d: _write_config(d, use_dora=True), "use_dora=True is not supported"),
    ],
)
def test_bad_adapter_is_a_clear_error_and_the_engine_keeps_serving(llm, adapters, tmp_path, edit, match):
    path = _broken(adapters[0], tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=match) as err:
        llm.generate(["def f():"], PARAMS, use_tqdm=False, lora_request=LoRARequest("bad", 99, path))
    assert "'bad'" in str(err.value)
    assert not llm.llm_engine.has_unfinished_requests()
    ok = LoRARequest("ok", 21, str(adapters[1]))
    assert len(llm.generate(["def f():"], PARAMS, use_tqdm=False, lora_request=ok)[0].outputs[0].token_ids) == 2


def test_lora_request_needs_enable_lora(llama_dir, adapters):
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=16)
    try:
        with pytest.raises(ValueError, match="needs lora.enable_lora=true"):
            llm.generate(["x"], PARAMS, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapters[0])))
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_loras": 0}, r"lora.max_loras=0: must be in \[1, inf\)"),
        ({"max_lora_rank": 0}, r"lora.max_lora_rank=0"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "lora.max_cpu_loras=2: must be at least lora.max_loras=4"),
    ],
)
def test_bad_lora_config(llama_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(llama_dir), dtype="float32", device="cpu", enable_lora=True, **kwargs)


def test_lora_request_fields():
    with pytest.raises(ValueError, match="lora_int_id=0: must be an int >= 1"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(ValueError, match="one, or one per prompt"):
        llm = object.__new__(LLM)
        llm.cfg = SimpleNamespace(model=SimpleNamespace(runner="generate"))  # no engine: fails before it is needed
        LLM.generate(llm, ["a", "b"], PARAMS, lora_request=[None])


def test_pooling_request_refuses_an_adapter():
    processor = object.__new__(Processor)  # the check comes before anything the engine's processor holds
    with pytest.raises(ValueError, match="pooling runs the base model"):
        processor.process("r", "a", PoolingParams(), lora_request=LoRARequest("a", 1, "/x"))

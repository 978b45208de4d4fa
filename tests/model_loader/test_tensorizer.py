"""load.format=tensorizer: a checkpoint serialized with tools/serialize_tensorizer.py
generates what the safetensors original generates, token for token."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tools.serialize_tensorizer import main as serialize_main

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
PROMPTS = ["def f(x):", "import"]


def _outputs(llm: LLM) -> list[tuple[list[int], list[float]]]:
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return [
        (o.outputs[0].token_ids, [lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]) for o in outs
    ]


def test_tensorizer_round_trip_equals_safetensors(llama_dir, tmp_path):
    out = tmp_path / "tensorized"
    serialize_main([str(llama_dir), str(out)])
    assert (out / "model.tensors").is_file() and not list(out.glob("*.safetensors"))
    expected = _outputs(LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16))
    llm = LLM(model=str(out), dtype="float32", num_gpu_blocks_override=16, load_format="tensorizer")
    assert type(llm.llm_engine.core.executor.worker.model_runner.model).__name__ == "LlamaForCausalLM"
    assert _outputs(llm) == expected  # same weights, bit for bit


def test_tensorizer_without_a_file_says_how_to_make_one(llama_dir):
    with pytest.raises(ValueError, match="tools/serialize_tensorizer.py"):
        LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16, load_format="tensorizer")

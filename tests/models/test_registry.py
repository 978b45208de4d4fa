"""The architecture registry: coverage by parity tests, out-of-tree models, overrides."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.store import build_config
from minivllm.models.llama import LlamaForCausalLM
from minivllm.models.registry import ModelRegistry
from tests.models.parity_cases import PARITY_CASES

FAVOURITE = 7


class FavouriteTokenLlama(LlamaForCausalLM):
    """An out-of-tree model: Llama whose logits always favour one token, so a test
    can tell from the output alone that this class (not Llama) ran."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        logits[:, FAVOURITE] += 1000.0
        return logits


@pytest.fixture
def registry():
    """The global registry, restored after the test so registrations do not leak."""
    saved = dict(ModelRegistry._models)
    yield ModelRegistry
    ModelRegistry._models.clear()
    ModelRegistry._models.update(saved)


def test_every_registered_architecture_has_a_parity_test():
    from minivllm.models.registry import POOLING_ONLY
    from tests.multimodal.cases import MULTIMODAL_PARITY  # image-taking ones are checked with images
    from tests.pooling.test_embed import BASE_MODEL_CASES  # pooling-only ones are checked by embedding

    covered = {case.architecture for case in PARITY_CASES} | (POOLING_ONLY & set(BASE_MODEL_CASES))
    covered |= set(MULTIMODAL_PARITY)
    missing = sorted(set(ModelRegistry.get_supported_archs()) - covered)
    assert not missing, f"architectures without an entry in tests/models/parity_cases.py: {missing}"


def test_registry_lists_the_model_zoo():
    expected = {
        "OPTForCausalLM",
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "MistralForCausalLM",
        "GPT2LMHeadModel",
        "GPTNeoXForCausalLM",
        "Phi3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "MixtralForCausalLM",
    }
    assert expected <= set(ModelRegistry.get_supported_archs())
    for arch in expected:  # every entry's "module:Class" string imports
        assert ModelRegistry.resolve(arch).__name__ == arch


def _greedy(llm: LLM, n: int = 6) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": [5, 9, 11, 30]}], params, use_tqdm=False)[0].outputs[0].token_ids


def test_out_of_tree_model_by_architecture_override(registry, llama_dir):
    registry.register_model("FavouriteTokenLlama", f"{__name__}:FavouriteTokenLlama")
    plain = _greedy(LLM(model=str(llama_dir), dtype="float32", num_gpu_blocks_override=16))
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        num_gpu_blocks_override=16,
        overrides=["model.architecture=FavouriteTokenLlama"],
    )
    assert llm.cfg.architecture == "FavouriteTokenLlama"
    assert plain != [FAVOURITE] * 6  # the checkpoint on its own does not produce this
    assert _greedy(llm) == [FAVOURITE] * 6


def test_out_of_tree_model_named_by_config_json(registry, llama_dir, tmp_path):
    ckpt = shutil.copytree(llama_dir, tmp_path / "custom")
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["MyCustomForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="MyCustomForCausalLM.*not supported.*LlamaForCausalLM"):
        build_config([f"model.path={ckpt}"])
    registry.register_model("MyCustomForCausalLM", FavouriteTokenLlama)  # a class works as well as a string
    assert _greedy(LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=16)) == [FAVOURITE] * 6


def test_unknown_architecture_override_fails_when_the_config_is_built(llama_dir):
    with pytest.raises(ValueError, match="'NopeForCausalLM' is not supported; supported are: .*GPT2LMHeadModel"):
        build_config([f"model.path={llama_dir}", "model.architecture=NopeForCausalLM"])


def test_register_model_rejects_a_path_without_a_class(registry):
    with pytest.raises(ValueError, match="expected 'package.module:ClassName'"):
        registry.register_model("MyArch", "my_pkg.my_model")
    assert not registry.is_supported("MyArch")

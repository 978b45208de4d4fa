"""``model=X`` picks a preset; a path or hub id there gets the override that works."""

from __future__ import annotations

import pytest

from minivllm import compose
from minivllm.config.store import check_model_choice, model_presets


@pytest.mark.parametrize("value", ["/ckpts/llama", "Qwen/Qwen3-0.6B", "llama-q4.gguf", "./my_model"])
def test_a_checkpoint_given_as_the_model_group_names_model_path(value):
    with pytest.raises(ValueError, match=f"model.path={value}") as err:
        compose([f"model={value}"])
    assert "demo" in str(err.value) and "not a model preset" in str(err.value)


def test_presets_sweeps_and_other_keys_pass():
    check_model_choice([f"model={name}" for name in model_presets()])
    check_model_choice(["-m", "model=demo,opt-125m", "model=choice(demo,gpt2)", "model.path=/ckpts/x"])
    assert "demo" in model_presets()

"""The committed demo checkpoint (``minivllm/assets/demo-llama``) loads offline
with transformers and writes something that looks like Python.

It is produced by ``tools/train_demo.py``; rerun that script to regenerate it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

CHECKPOINT = Path(__file__).resolve().parent.parent / "minivllm" / "assets" / "demo-llama"
MAX_BYTES = 20_000_000

# Indentation, a blank line, a tab, trailing spaces and non-ASCII text.
SNIPPET = (
    "class Stack:\n"
    '    """A LIFO stack \u2014 last in, first out."""\n'
    "\n"
    "    def push(self, item):  \n"
    "\tself._items.append(item)\n"
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(CHECKPOINT, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    return LlamaForCausalLM.from_pretrained(CHECKPOINT, local_files_only=True, dtype=torch.float32).eval()


def test_checkpoint_is_small():
    size = sum(f.stat().st_size for f in CHECKPOINT.rglob("*") if f.is_file())
    assert 0 < size <= MAX_BYTES, f"{size / 1e6:.1f} MB"


def test_config_describes_a_small_gqa_llama(tokenizer):
    config = AutoConfig.from_pretrained(CHECKPOINT, local_files_only=True)
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer)
    assert config.bos_token_id == tokenizer.bos_token_id
    assert config.eos_token_id == tokenizer.eos_token_id


def test_training_log_is_present():
    log = json.loads((CHECKPOINT / "training_log.json").read_text())
    assert log["command"].startswith("python tools/train_demo.py")
    assert log["training"]["steps"] > 0


def test_tokenizer_round_trips_python(tokenizer):
    ids = tokenizer(SNIPPET).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == SNIPPET


def test_greedy_continuation_looks_like_python(model, tokenizer):
    inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(ids[0], skip_special_tokens=True)
    assert "\n    " in text or "\n\t" in text, text


def test_minivllm_default_model_matches_transformers_greedy(model, tokenizer):
    """The embedded default (model=demo) is this checkpoint, and minivllm's greedy
    text on it equals transformers' on the same files."""
    from minivllm import LLM, SamplingParams

    llm = LLM(num_gpu_blocks_override=64)
    assert llm.cfg.checkpoint_dir.resolve() == CHECKPOINT.resolve()
    prompt = "def fibonacci(n):"
    ours = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    theirs = ids[0, inputs.input_ids.shape[1] :].tolist()
    assert ours.token_ids == theirs[: len(ours.token_ids)]
    assert ours.text == tokenizer.decode(ours.token_ids, skip_special_tokens=True)

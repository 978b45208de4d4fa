"""The scripts in examples/ (written as vLLM's examples are, apart from the import name) run
against the test checkpoints and print what they promise."""

from __future__ import annotations

import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.model_loader.weight_files import copy_model_files

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "offline_inference"
RLHF = EXAMPLES.parent / "rlhf_weight_sync.py"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ '\\n' }}{% endfor %}assistant:"


@pytest.fixture(scope="module")
def chat_llama(llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("example-chat") / "ckpt"
    shutil.copytree(llama_dir, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out)
    return out


def _run(script: str, *args: str, monkeypatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setattr(sys, "argv", [script, *args, "--num-gpu-blocks-override", "64"])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")


def test_chat_example(chat_llama, tmp_path, monkeypatch, capsys):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE.replace("assistant:", "bot:"))
    _run(
        "chat.py",
        "--model",
        str(chat_llama),
        "--max-tokens",
        "4",
        "--chat-template-path",
        str(template),
        monkeypatch=monkeypatch,
    )
    out = capsys.readouterr().out
    assert out.count("Generated text:") == 5
    assert "user: Hello\\n" in out and "bot:'" in out


def test_embed_example(llama_dir, monkeypatch, capsys):
    _run("embed.py", "--model", str(llama_dir), monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert out.count("Embeddings: [") == 4 and "(size=64)" in out


def test_beam_search_example(opt_dir, monkeypatch, capsys):
    _run("beam_search.py", "--model", str(opt_dir), "--beam-width", "2", "--max-tokens", "4", monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert out.count("beam 0:") == 2 and out.count("beam 1:") == 2


def test_rlhf_weight_sync_example(monkeypatch, capsys, tmp_path):
    """The engine's last rollouts are a fresh engine's on the trainer's final weights (rebuilt here
    with the example's own train_step), and each update changed them."""
    torch.set_num_threads(1)
    monkeypatch.setattr(sys, "argv", [RLHF.name, "--max-tokens", "6", "--num-gpu-blocks-override", "64"])
    example = runpy.run_path(str(RLHF), run_name="__main__")
    out = capsys.readouterr().out
    assert "weights in sync: True" in out
    sections = out.split("-- rollouts ")[1:]
    assert len(sections) == 3 and len({s.split("\n", 1)[1] for s in sections}) == 3
    trained = tmp_path / "trained"
    copy_model_files(example["DEMO"], trained)
    model = AutoModelForCausalLM.from_pretrained(example["DEMO"], dtype=torch.float32)
    example["train_step"](model, seed=1)
    example["train_step"](model, seed=2)
    model.save_pretrained(trained)
    fresh = LLM(model=str(trained), dtype="float32", num_gpu_blocks_override=64)
    try:
        outs = fresh.generate(example["PROMPTS"], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    finally:
        fresh.shutdown()
    for o in outs:
        assert f"Prompt: {o.prompt!r}, Generated text: {o.outputs[0].text!r}" in sections[2]

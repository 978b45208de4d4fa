"""examples/offline_inference/vision_language.py runs against the tiny LLaVA checkpoint
and prints both replies (the prompt one and the chat one)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "offline_inference" / "vision_language.py"


def test_vision_language_example(llava_dir, monkeypatch, capsys):
    torch.set_num_threads(1)
    argv = [str(EXAMPLE), "--model", str(llava_dir), "--max-tokens", "4", "--num-gpu-blocks-override", "64"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "Generated text: '" in out and "Chat reply: '" in out

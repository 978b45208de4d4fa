"""Stage d7's text check: the tiny random LLaVA (tools/tiny_vlm.py, real weights) with CUDA
graphs and eagerly, same greedy tokens?

    python3 -m tools.gpu_session.vlm_graphs STAGE_DIR [--tokenizer DIR]

Writes STAGE_DIR/vlm_graphs/ and STAGE_DIR/vlm_eager/, each an ``outputs.jsonl`` (one line
per prompt: ``token_ids``, ``text``) and a ``run.json`` (device, dtype, whether graphs were
captured); ``stage_metrics multimodal`` compares them. Four prompts, a captured batch
size, so the decode steps replay a graph of exactly the eager run's shapes; the engine's
defaults otherwise (on CUDA: bf16, async scheduling, torch.compile of the small ops) but
a KV cache of 64 blocks, all the 4 requests need.
On the CPU graphs are never captured and the check says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

NUM_PROMPTS, MAX_TOKENS = 4, 32


def images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)) for _ in range(n)]


def run(checkpoint: Path, out: Path, eager: bool) -> None:
    from minivllm import LLM, SamplingParams
    from tools.tiny_vlm import LLAVA_PROMPT

    llm = LLM(str(checkpoint), enforce_eager=eager, max_model_len=256, num_gpu_blocks_override=64, seed=0)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        prompts = [{"prompt": LLAVA_PROMPT, "multi_modal_data": {"image": im}} for im in images(NUM_PROMPTS)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        runner = llm.llm_engine.core.executor.worker.model_runner
        info = {
            "device": str(runner.device),
            "dtype": str(llm.cfg.dtype),
            "cuda_graphs_captured": runner.cuda_graphs is not None,
        }
    finally:
        llm.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text}) for o in outs]
    (out / "outputs.jsonl").write_text("\n".join(lines) + "\n")
    (out / "run.json").write_text(json.dumps(info))


def main(argv: list[str] | None = None) -> int:
    from tools.tiny_vlm import build_llava, train_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stage_dir", type=Path)
    p.add_argument("--tokenizer", type=Path, help="a trained tokenizer directory to reuse (trained into it when empty)")
    args = p.parse_args(argv)
    tokenizer = args.tokenizer or args.stage_dir / "tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        tokenizer.mkdir(parents=True, exist_ok=True)
        train_tokenizer(tokenizer)
    checkpoint = build_llava(args.stage_dir / "tiny-llava", tokenizer)
    for name, eager in (("vlm_graphs", False), ("vlm_eager", True)):
        print(f"== tiny LLaVA, {name}", flush=True)
        run(checkpoint, args.stage_dir / name, eager)
    return 0


if __name__ == "__main__":
    sys.exit(main())

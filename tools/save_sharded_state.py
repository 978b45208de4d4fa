"""Save a checkpoint for ``load.format=sharded_state``: one set of files per tensor-parallel rank.

    python tools/save_sharded_state.py path/to/hf_checkpoint path/to/out_dir --tp 2
    python -m minivllm model.path=path/to/out_dir load.format=sharded_state parallel.tp=2

It starts an engine at the given tensor-parallel size, has each rank write its
own parameters (``model-rank-R-part-P.safetensors``), and copies the
checkpoint's config and tokenizer files. Load at the same size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minivllm import LLM  # noqa: E402
from minivllm.model_loader.sharded_state import MAX_PART_BYTES, save_sharded_state  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint directory")
    parser.add_argument("out", type=Path, help="directory for the per-rank files")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size to shard for (default 1)")
    parser.add_argument("--dtype", default="auto", help="weight dtype: auto, float32, float16, bfloat16")
    parser.add_argument("--max-part-gib", type=float, default=MAX_PART_BYTES / 2**30, help="largest file, GiB")
    args = parser.parse_args(argv)
    llm = LLM(model=str(args.checkpoint), tensor_parallel_size=args.tp, dtype=args.dtype, num_gpu_blocks_override=1)
    try:
        files = save_sharded_state(llm, args.out, int(args.max_part_gib * 2**30))
    finally:
        llm.shutdown()
    print(f"wrote {sum(map(len, files))} files for {len(files)} rank(s) to {args.out}")


if __name__ == "__main__":
    main()

"""Serialize a checkpoint for ``load.format=tensorizer``.

    python tools/serialize_tensorizer.py path/to/hf_checkpoint path/to/out_dir
    python -m minivllm model.path=path/to/out_dir load.format=tensorizer

The output directory holds ``model.tensors`` (the weights, under their
checkpoint names) and copies of the checkpoint's config and tokenizer files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minivllm.model_loader.tensorizer_loader import serialize_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint directory (safetensors or .bin/.pt)")
    parser.add_argument("out", type=Path, help="directory to write model.tensors and the model's other files to")
    args = parser.parse_args(argv)
    if not (args.checkpoint / "config.json").is_file():
        parser.error(f"checkpoint {str(args.checkpoint)!r}: no config.json there")
    path = serialize_checkpoint(args.checkpoint, args.out)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()

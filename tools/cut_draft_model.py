"""Cut a draft model from a Llama-style checkpoint: its first N decoder layers.

The draft keeps the embeddings, final norm, LM head and tokenizer, so it speaks
the target's tokenizer; with the demo model (4 layers) a 2-layer cut runs about
twice as fast per token and agrees with the full model on easy continuations.

    python tools/cut_draft_model.py minivllm/assets/demo-llama /tmp/demo-draft --layers 2
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def cut_layers(src: Path, dst: Path, num_layers: int) -> Path:
    """Write ``dst``: ``src`` with only decoder layers ``0 .. num_layers - 1`` (one safetensors file)."""
    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"--layers={num_layers}: must be in [1, {config['num_hidden_layers']}]")
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            match = _LAYER.search(name)
            if match is None or int(match.group(1)) < num_layers:
                tensors[name] = tensor
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    if "layer_types" in config:  # per-layer attention kinds (sliding / full) of newer configs
        config["layer_types"] = config["layer_types"][:num_layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for file in src.iterdir():
        if file.name not in ("config.json", "training_log.json") and file.suffix != ".safetensors":
            shutil.copy(file, dst / file.name)
    return dst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    print(cut_layers(args.src, args.dst, args.layers))


if __name__ == "__main__":
    main()

"""A random EAGLE head for a Llama checkpoint, in vLLM's EAGLE-1 layout.

minivllm reads EAGLE heads (``speculative.method=eagle``); with no trained head
at hand, a random one shows the method's cost and lets tests check that outputs
stay exact (a random head drafts badly, so its acceptance rate says nothing).

    python tools/make_eagle_head.py minivllm/assets/demo-llama /tmp/demo-eagle
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM


def make_eagle_head(target: Path, out: Path, seed: int = 0, **config_changes) -> Path:
    """A one-layer head in vLLM's EAGLE-1 layout (``fc.weight``, ``layers.0.*``) with random
    weights; it also carries ``embed_tokens.weight``, which loaders must ignore."""
    config = LlamaConfig.from_pretrained(target)
    config.num_hidden_layers = 1
    for key, value in config_changes.items():
        setattr(config, key, value)
    with torch.random.fork_rng():  # leaves the caller's global generator as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        fc = torch.randn(config.hidden_size, 2 * config.hidden_size) / (2 * config.hidden_size) ** 0.5
    tensors = {k.removeprefix("model."): v for k, v in model.state_dict().items() if k.startswith("model.layers.")}
    del tensors["layers.0.input_layernorm.weight"]
    tensors["fc.weight"] = fc
    tensors["embed_tokens.weight"] = model.model.embed_tokens.weight
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().float() for k, v in tensors.items()}, out / "model.safetensors")
    config.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_eagle_head(args.target, args.out, args.seed))


if __name__ == "__main__":
    main()

"""A GGUF file's metadata as a Hugging Face config.

A GGUF file (llama.cpp's format) carries no ``config.json``: the model's shape
is stored as metadata under ``<architecture>.*`` keys, the vocabulary under
``tokenizer.ggml.*``. ``model.path`` names the file, or a directory holding
exactly one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import LlamaConfig, PretrainedConfig

SUPPORTED_ARCHITECTURES = ("llama",)
"""GGUF ``general.architecture`` values that load (Llama and its look-alikes, e.g. Mistral)."""


def find_gguf_file(path: str) -> Path:
    """The ``.gguf`` file that ``model.path`` names, directly or as the only one in a directory."""
    local = Path(path).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        return local
    if local.is_dir():
        found = sorted(local.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ValueError(f"model.path={path!r}: holds several .gguf files ({names}); name one of them")
    raise ValueError(f"model.path={path!r}: load.format=gguf needs a .gguf file or a directory holding one")


def read_metadata(gguf_path: Path) -> tuple[dict[str, Any], list[str]]:
    """Scalar metadata (arrays only as their length, tokens aside) and the tensor names of a file."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(gguf_path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types:
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            meta[key] = len(field.data)
        else:
            meta[key] = field.contents()
    return meta, [t.name for t in reader.tensors]


def gguf_hf_config(gguf_path: Path) -> PretrainedConfig:
    """The transformers config that the file's metadata describes."""
    meta, tensor_names = read_metadata(gguf_path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model.path={str(gguf_path)!r}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none" or "rope_freqs.weight" in tensor_names:
        raise ValueError(f"model.path={str(gguf_path)!r}: GGUF files with RoPE scaling are not supported")
    return LlamaConfig(**_llama_fields(meta, arch, tensor_names))


def _llama_fields(meta: dict[str, Any], arch: str, tensor_names: list[str]) -> dict[str, Any]:
    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata: missing {arch}.{name}")
        return value

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(key("vocab_size", meta.get("tokenizer.ggml.tokens"))),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }

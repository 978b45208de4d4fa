"""The draft model's (or EAGLE head's) own config, derived from the target's (``speculative.model``).

The draft runs in the target's worker, beside it: same device, dtype, KV-cache
block size and cache dtype, same context length, the target's token budget,
one rank. It must speak the target's tokenizer: the vocabulary sizes must
match, and where both checkpoints ship a ``tokenizer.json`` their vocabularies
must be equal, else drafts would be other tokens than the target reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def draft_model_config(target: "VllmConfig") -> "VllmConfig":
    """The draft's VllmConfig (built as the target's own class); a bad draft is a ValueError naming
    ``speculative.model``."""

    spec = target.speculative
    if target.parallel.tp > 1:
        raise ValueError(
            f"speculative.method={spec.method}: the draft runs unsharded beside the target, "
            f"so parallel.tp={target.parallel.tp} is not supported; use parallel.tp=1"
        )
    eagle = spec.method == "eagle"
    if eagle and target.architecture != "LlamaForCausalLM":
        raise ValueError(
            f"speculative.method=eagle: EAGLE heads are supported for LlamaForCausalLM targets, "
            f"not {target.architecture}; use speculative.method=draft_model or ngram"
        )
    node = {
        "model": {
            "path": spec.model,
            "dtype": _DTYPE_NAMES[target.dtype],
            "max_model_len": target.max_model_len,
            "seed": target.model.seed,
            "architecture": "LlamaForCausalLM" if eagle else None,
        },
        "device": {"type": target.device_type},
        "attention": {"name": target.attention.name},
        "cache": {"block_size": target.cache.block_size, "cache_dtype": target.cache.cache_dtype},
        "scheduler": {
            "max_num_batched_tokens": target.scheduler.max_num_batched_tokens,
            "max_num_seqs": target.scheduler.max_num_seqs,
            "enable_chunked_prefill": target.scheduler.enable_chunked_prefill,
        },
        "load": {"download_dir": target.load.download_dir},
    }
    try:
        draft = type(target).from_dictconfig(node)
    except ValueError as e:
        raise ValueError(f"speculative.model={spec.model!r}: {e}") from e
    _check_same_vocab(spec.model, target, draft)
    if eagle:
        _check_eagle_head(spec.model, target, draft)
    return draft


def _check_eagle_head(name: str, target: "VllmConfig", head: "VllmConfig") -> None:
    """The head reads the target's hidden states and embeddings: same width; no HASS norms."""
    want, got = target.hf_config.hidden_size, head.hf_config.hidden_size
    if want != got:
        raise ValueError(f"speculative.model={name!r}: hidden_size {got} differs from the target's {want}")
    if getattr(head.hf_config, "add_para_norm", False):
        raise ValueError(f"speculative.model={name!r}: EAGLE heads with add_para_norm (HASS) are not supported")
    names = set()
    for file in Path(head.checkpoint_dir).glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            names.update(f.keys())
    if not {"fc.weight", "model.fc.weight"} & names:
        raise ValueError(f"speculative.model={name!r}: no fc.weight in its safetensors files: not an EAGLE head")


def _check_same_vocab(name: str, target: "VllmConfig", draft: "VllmConfig") -> None:
    want, got = _vocab_size(target.hf_config), _vocab_size(draft.hf_config)
    if want != got:
        raise ValueError(
            f"speculative.model={name!r}: vocab_size {got} differs from the target's {want}; "
            "the draft must use the target's tokenizer"
        )
    mine, theirs = _tokenizer_vocab(target.tokenizer_path), _tokenizer_vocab(draft.tokenizer_path)
    if mine is not None and theirs is not None and mine != theirs:
        raise ValueError(
            f"speculative.model={name!r}: its tokenizer.json maps tokens to other ids than the target's; "
            "the draft must use the target's tokenizer"
        )


def _vocab_size(hf_config: Any) -> int:
    text = getattr(hf_config, "text_config", None) or hf_config
    return int(text.vocab_size)


def _tokenizer_vocab(path: str) -> dict | None:
    """The token -> id map of a checkpoint's tokenizer.json (added tokens included); None without one."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    vocab = dict(data.get("model", {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab

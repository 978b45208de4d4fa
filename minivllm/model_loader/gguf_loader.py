"""``load.format=gguf``: weights from a llama.cpp GGUF file, dequantized at load.

llama.cpp's converter renames every tensor, stores shapes innermost-first, and
permutes the rows of the q and k projections so that each head's rotary pairs
sit next to each other (interleaved, GPT-J style) rather than in two halves
(Hugging Face's rotate-half). This loader undoes all three and hands
Hugging Face names to the model's own ``load_weights``, so tensor-parallel
sharding and fused q/k/v work as for any checkpoint. Quantized tensors (Q8_0,
Q4_0, Q4_K, Q6_K, ...) are dequantized with the ``gguf`` package's
dequantizers, one tensor at a time, and cast to the model dtype on copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import torch

from minivllm.config.load import find_gguf_file
from minivllm.config.vllm_config import VllmConfig
from minivllm.model_loader.loader import DefaultModelLoader

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str:
    """llama.cpp's tensor name -> the Hugging Face Llama name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r}: no Llama parameter of that name")
    layer, module, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[module]}.{kind}"


def unpermute_rotary_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation: (heads * head_dim, ...) with each head's rotary pairs
    interleaved back to the two halves (rotate-half) layout Hugging Face uses."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(tensor: Any) -> torch.Tensor:
    """A ``gguf.ReaderTensor`` as a float32 tensor in row-major (PyTorch) order."""
    from gguf import dequantize as gguf_dequantize

    try:
        values = gguf_dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise ValueError(
            f"GGUF tensor {tensor.name!r}: quantization type {tensor.tensor_type.name} cannot be dequantized ({err})"
        ) from None
    return torch.tensor(values, dtype=torch.float32)  # a copy: F32/F16 tensors are views of the mmap


def iterate_gguf_weights(path: Path, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor of the file."""
    from gguf import GGUFReader

    for tensor in GGUFReader(str(path)).tensors:
        name = hf_name(tensor.name)
        weight = dequantize(tensor)
        if name.endswith("q_proj.weight"):
            weight = unpermute_rotary_rows(weight, num_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rotary_rows(weight, num_kv_heads)
        yield name, weight


class GGUFModelLoader(DefaultModelLoader):
    """The default build (meta device, then materialise) with weights read from a GGUF file."""

    def _weights(self, cfg: VllmConfig) -> Iterator[tuple[str, Any]]:
        hf = cfg.hf_config
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        return iterate_gguf_weights(find_gguf_file(cfg.model.path), hf.num_attention_heads, num_kv_heads)

"""Writing small GGUF files from a Hugging Face Llama checkpoint, as llama.cpp's
converter lays them out: its tensor names, its q/k row permutation, reversed
shapes, metadata under ``llama.*`` and the byte-level BPE vocabulary under
``tokenizer.ggml.*``. Quantized tensors come from the ``gguf`` package's own
quantizers (Q8_0, Q4_0); K-quants, which it cannot produce, are written as
well-formed random blocks (random bits, sane scales).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

Q = gguf.GGMLQuantizationType
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, idx, rest = hf_name.split(".", 3)  # model.layers.N.<module>.weight
    module = rest.rsplit(".", 1)[0]
    return f"blk.{idx}.{_LAYER_NAMES[module]}.weight"


def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permutation: each head's rotate-half halves become interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(ckpt: Path, out: Path, qtype: Q, k_quant_tensors: dict[str, Q] | None = None) -> Path:
    """Write ``ckpt`` (a Llama checkpoint directory) to ``out``: every 2-D weight in ``qtype``
    (norms stay F32), except the tensors named in ``k_quant_tensors`` (GGUF names), which get
    random K-quant blocks of the given type."""
    config = json.loads((ckpt / "config.json").read_text())
    tokenizer = json.loads((ckpt / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(out), "llama")
    _write_metadata(writer, config, tokenizer)
    rng = np.random.default_rng(0)
    for name, tensor in load_file(ckpt / "model.safetensors").items():
        target = gguf_name(name)
        data = tensor.float().numpy()
        if ".attn_q." in target:
            data = permute_for_gguf(data, config["num_attention_heads"])
        elif ".attn_k." in target:
            data = permute_for_gguf(data, config["num_key_value_heads"])
        kq = (k_quant_tensors or {}).get(target)
        if kq is not None:
            writer.add_tensor(target, random_k_quant(data.shape, kq, rng), raw_dtype=kq)
        elif data.ndim == 1 or qtype == Q.F32:
            writer.add_tensor(target, data.astype(np.float32))
        elif qtype == Q.F16:
            writer.add_tensor(target, data.astype(np.float16))
        else:
            writer.add_tensor(target, gguf.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_metadata(writer: gguf.GGUFWriter, config: dict, tokenizer: dict) -> None:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(config.get("rope_theta") or config["rope_parameters"]["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    specials = {t["content"] for t in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # 3: control, 1: normal
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])


def random_k_quant(shape: tuple[int, ...], qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K or Q6_K blocks for a (rows, cols) weight, cols a multiple of 256; the fp16
    super-block scales are set to small finite values so the weight is well-conditioned."""
    rows, cols = shape
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block_elems, block_bytes), dtype=np.uint8)
    scale = (
        np.full(blocks.shape[:2], 2e-3 / np.sqrt(cols), dtype=np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
    )
    if qtype == Q.Q4_K:  # layout: d (f16), dmin (f16), 12 bytes of 6-bit scales, 128 bytes of nibbles
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = scale
    elif qtype == Q.Q6_K:  # layout: 128 bytes low bits, 64 bytes high bits, 16 int8 scales, d (f16)
        blocks[..., -2:] = scale
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks.reshape(rows, -1)


def dequantized_reference(path: Path, name: str) -> torch.Tensor:
    """A tensor of the file as the ``gguf`` package's reference dequantizer reads it (GGUF order)."""
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.name == name)
    return torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type).copy())

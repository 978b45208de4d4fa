"""Tiny transformers configs for each supported family (shapes chosen to hit their quirks)."""
from __future__ import annotations

from transformers import LlamaConfig, OPTConfig

VOCAB = 512  # matches tests.checkpoints.train_tokenizer


def opt_config(**overrides) -> OPTConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        max_position_embeddings=256,
        word_embed_proj_dim=64,
        do_layer_norm_before=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["OPTForCausalLM"],
    )
    return OPTConfig(**{**base, **overrides})


def llama_config(tie: bool = False, **overrides) -> LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        architectures=["LlamaForCausalLM"],
    )
    return LlamaConfig(**{**base, **overrides})

"""Tiny transformers configs for each supported family (shapes chosen to hit their quirks)."""
from __future__ import annotations

from transformers import (
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

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
    return LlamaConfig(**_llama_like(tie_word_embeddings=tie, architectures=["LlamaForCausalLM"], **overrides))


def _llama_like(**overrides) -> dict:
    """The shape shared by the Llama descendants: GQA (4 query heads over 2 KV heads)."""
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return {**base, **overrides}


def qwen2_config(**overrides) -> Qwen2Config:
    """QKV bias; a window of 6 on layer 1 only (max_window_layers=1), so one layer slides and one does not."""
    base = _llama_like(
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
        tie_word_embeddings=False,
        architectures=["Qwen2ForCausalLM"],
    )
    return Qwen2Config(**{**base, **overrides})


def qwen3_config(**overrides) -> Qwen3Config:
    """Per-head q/k RMSNorm and an explicit head_dim of 24 (4 heads * 24 != hidden 64); tied."""
    base = _llama_like(head_dim=24, tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"])
    return Qwen3Config(**{**base, **overrides})


def mistral_config(**overrides) -> MistralConfig:
    """Sliding window of 5 tokens on every layer (shorter than most prompts), one KV head (MQA)."""
    base = _llama_like(
        num_key_value_heads=1, sliding_window=5, tie_word_embeddings=False, architectures=["MistralForCausalLM"]
    )
    return MistralConfig(**{**base, **overrides})


def qwen3_moe_config(**overrides) -> Qwen3MoeConfig:
    """8 experts of width 32, top-2 without renormalization; layer 1 dense (mlp_only_layers)."""
    base = _llama_like(
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        tie_word_embeddings=False,
        architectures=["Qwen3MoeForCausalLM"],
    )
    return Qwen3MoeConfig(**{**base, **overrides})


def mixtral_config(**overrides) -> MixtralConfig:
    """8 experts of width 48, top-2 renormalized, on every layer; window of 6."""
    base = _llama_like(
        intermediate_size=48,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=6,
        tie_word_embeddings=False,
        architectures=["MixtralForCausalLM"],
    )
    return MixtralConfig(**{**base, **overrides})


def phi3_config(**overrides) -> Phi3Config:
    """Fused qkv/gate_up in the checkpoint, GQA, half the head rotated, window of 7."""
    base = _llama_like(
        partial_rotary_factor=0.5,
        sliding_window=7,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        tie_word_embeddings=False,
        architectures=["Phi3ForCausalLM"],
    )
    return Phi3Config(**{**base, **overrides})


def gpt2_config(**overrides) -> GPT2Config:
    """Conv1D weights, learned positions, tied LM head."""
    base = dict(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        architectures=["GPT2LMHeadModel"],
    )
    return GPT2Config(**{**base, **overrides})


def gpt_neox_config(**overrides) -> GPTNeoXConfig:
    """Parallel residual, a quarter of each 16-wide head rotated (rotary_pct=0.25), untied."""
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        architectures=["GPTNeoXForCausalLM"],
    )
    return GPTNeoXConfig(**{**base, **overrides})

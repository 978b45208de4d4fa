"""Tiny transformers configs for each supported family (shapes chosen to hit their quirks)."""

from __future__ import annotations

from transformers import (
    DeepseekV2Config,
    DeepseekV3Config,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    GptOssConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
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


def gemma2_config(**overrides) -> Gemma2Config:
    """Window 6 on layers 0 and 2, global layer 1; attention scores capped at 1.5 and
    logits at 4 (both bind on these weights); query_pre_attn_scalar 24 != head_dim 16."""
    base = _llama_like(
        num_hidden_layers=3,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=24,
        sliding_window=6,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=4.0,
        tie_word_embeddings=True,
        architectures=["Gemma2ForCausalLM"],
    )
    return Gemma2Config(**{**base, **overrides})


def gemma3_config(**overrides) -> Gemma3TextConfig:
    """Local layers 0 and 2 (window 6, RoPE base 10k), global layer 1 (base 1M, linear
    scaling 2); per-head q/k norms; one KV head; query_pre_attn_scalar 64 != head_dim 16
    (which also keeps the normed q.k scores small enough for bf16 to track fp32)."""
    base = _llama_like(
        num_hidden_layers=3,
        num_key_value_heads=1,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=64,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
        },
        tie_word_embeddings=True,
        architectures=["Gemma3ForCausalLM"],
    )
    return Gemma3TextConfig(**{**base, **overrides})


def olmo2_config(**overrides) -> Olmo2Config:
    """Post-sublayer norms; q/k RMSNorm over all heads of each projection; GQA; untied."""
    base = _llama_like(tie_word_embeddings=False, architectures=["Olmo2ForCausalLM"])
    return Olmo2Config(**{**base, **overrides})


def granite_config(**overrides) -> GraniteConfig:
    """The four multipliers set away from 1 (Granite 3's values are 12, 0.22, 1/64, 8); tied."""
    base = _llama_like(
        embedding_multiplier=6.0,
        residual_multiplier=0.4,
        attention_multiplier=0.2,
        logits_scaling=1.5,
        tie_word_embeddings=True,
        architectures=["GraniteForCausalLM"],
    )
    return GraniteConfig(**{**base, **overrides})


def phi3_longrope_config(**overrides) -> Phi3Config:
    """Phi-3-128k's LongRoPE at toy scale: an original context of 8 tokens (every test
    sequence is longer, so transformers uses the long factors too), 256 now, so
    cos/sin carry an attention factor of sqrt(1 + ln 32 / ln 8)."""
    half = 8  # head_dim 16, fully rotated
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [1.0 + 1.5 * i for i in range(half)],
    }
    return phi3_config(partial_rotary_factor=1.0, original_max_position_embeddings=8, rope_parameters=rope, **overrides)


def qwen2_yarn_config(**overrides) -> Qwen2Config:
    """Qwen's YaRN long-context recipe (factor 4 over an original context of 8 tokens), no window."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 10000.0}
    return qwen2_config(use_sliding_window=False, rope_parameters=rope, **overrides)


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


def gpt_oss_config(**overrides) -> GptOssConfig:
    """Sinks, q/k/v/o biases, 4 layers alternating a window of 5 and full attention, 8 biased
    experts of width 32 (MXFP4 needs multiples of 32) top-2 with the clamped SwiGLU (limit 2.0,
    low enough that random weights hit it), YaRN over an original 64 positions."""
    base = _llama_like(
        hidden_size=64,
        intermediate_size=32,
        head_dim=16,
        num_hidden_layers=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=5,
        swiglu_limit=2.0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        architectures=["GptOssForCausalLM"],
    )
    return GptOssConfig(**{**base, **overrides})


def _deepseek_like(**overrides) -> dict:
    """MLA with 4 heads: latent 16 + rope 8 per token (24 values) against per-head K/V of
    4 * (16 + 8 + 12) = 144; 8 routed experts of width 32 top-2 plus a shared one; layer 0 dense."""
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return {**base, **overrides}


def deepseek_v2_config(**overrides) -> DeepseekV2Config:
    """V2-Lite's shape: no q_lora_rank (q_proj), greedy softmax top-2, interleaved rope."""
    base = _deepseek_like(q_lora_rank=None, topk_method="greedy", architectures=["DeepseekV2ForCausalLM"])
    return DeepseekV2Config(**{**base, **overrides})


def deepseek_v3_config(**overrides) -> DeepseekV3Config:
    """V3's shape: q_lora_rank 24, sigmoid router with correction bias over 4 groups (2 kept),
    renormalized and scaled by 2.5; DeepSeek yarn (factor 4 over 64, mscale 1, mscale_all_dim 0.8)."""
    base = _deepseek_like(
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        architectures=["DeepseekV3ForCausalLM"],
    )
    return DeepseekV3Config(**{**base, **overrides})


def qwen3_next_config(**overrides) -> Qwen3NextConfig:
    """Four layers (three Gated DeltaNet, then gated full attention: full_attention_interval 4);
    linear heads 2 key over 4 value (each key head serves two), conv width 4; full attention
    4 query heads over 2 KV heads of 16 with a quarter rotated; every layer a MoE of 8 experts of
    width 32, top-2 renormalised, plus a gated shared expert of 48."""
    base = _llama_like(
        hidden_size=64,
        intermediate_size=96,
        head_dim=16,
        num_hidden_layers=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        architectures=["Qwen3NextForCausalLM"],
    )
    return Qwen3NextConfig(**{**base, **overrides})

"""The table every model family must appear in: a tiny checkpoint per entry, built
to exercise that family's quirks, and checked against transformers by test_parity.

``test_registry`` fails when a registered architecture has no entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from transformers import PretrainedConfig

from tests.model_configs import (
    deepseek_v2_config,
    deepseek_v3_config,
    gemma2_config,
    gemma3_config,
    gpt2_config,
    gpt_neox_config,
    gpt_oss_config,
    granite_config,
    llama_config,
    mistral_config,
    mixtral_config,
    olmo2_config,
    opt_config,
    phi3_config,
    phi3_longrope_config,
    qwen2_config,
    qwen2_yarn_config,
    qwen3_config,
    qwen3_moe_config,
    qwen3_next_config,
)


@dataclass(frozen=True)
class ParityCase:
    name: str
    """Checkpoint name (make_checkpoint builds each name once per session)."""
    architecture: str
    """The config.json ``architectures`` entry it covers."""
    config: Callable[[], PretrainedConfig]
    """Builds the tiny transformers config."""


PARITY_CASES = [
    # Names shared with the conftest fixtures (opt_dir, llama_dir, llama_tied_dir) reuse their checkpoints.
    ParityCase("opt", "OPTForCausalLM", opt_config),
    ParityCase("llama-gqa-untied", "LlamaForCausalLM", lambda: llama_config(tie=False)),
    ParityCase("llama-gqa-tied", "LlamaForCausalLM", lambda: llama_config(tie=True)),
    ParityCase("qwen2-bias-window-on-layer1", "Qwen2ForCausalLM", qwen2_config),
    ParityCase("qwen3-qknorm-headdim24-tied", "Qwen3ForCausalLM", qwen3_config),
    ParityCase("mistral-window5-mqa", "MistralForCausalLM", mistral_config),
    ParityCase("qwen3-moe-8x-top2-raw-weights-dense-layer1", "Qwen3MoeForCausalLM", qwen3_moe_config),
    ParityCase(
        "qwen3-moe-8x-top2-renormalized-sparse-step2",
        "Qwen3MoeForCausalLM",
        lambda: qwen3_moe_config(norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=2),  # layer 0 dense
    ),
    ParityCase("mixtral-8x-top2-window6", "MixtralForCausalLM", mixtral_config),
    ParityCase("gpt-oss-sinks-window5-alternating-yarn", "GptOssForCausalLM", gpt_oss_config),
    ParityCase("phi3-fused-partial-rope-window7", "Phi3ForCausalLM", phi3_config),
    ParityCase("phi3-longrope-original8", "Phi3ForCausalLM", phi3_longrope_config),
    ParityCase("qwen2-yarn-factor4-original8", "Qwen2ForCausalLM", qwen2_yarn_config),
    ParityCase("gemma2-softcaps-window6-alternating", "Gemma2ForCausalLM", gemma2_config),
    ParityCase("gemma3-local-global-rope-qknorm", "Gemma3ForCausalLM", gemma3_config),
    ParityCase("olmo2-postnorm-full-qknorm", "Olmo2ForCausalLM", olmo2_config),
    ParityCase("granite-multipliers-tied", "GraniteForCausalLM", granite_config),
    ParityCase("gpt2-conv1d-tied", "GPT2LMHeadModel", gpt2_config),
    ParityCase(
        "gpt2-untied-inverse-layer-scale",
        "GPT2LMHeadModel",
        lambda: gpt2_config(tie_word_embeddings=False, scale_attn_by_inverse_layer_idx=True),
    ),
    ParityCase("deepseek-v2-lite-mla-greedy-router", "DeepseekV2ForCausalLM", deepseek_v2_config),
    ParityCase("qwen3-next-gated-deltanet-3to1-shared-expert", "Qwen3NextForCausalLM", qwen3_next_config),
    ParityCase(
        "deepseek-v2-mla-qlora-group-limited",
        "DeepseekV2ForCausalLM",
        lambda: deepseek_v2_config(q_lora_rank=24, topk_method="group_limited_greedy", n_group=4, topk_group=2),
    ),
    ParityCase("deepseek-v3-mla-yarn-grouped-sigmoid-router", "DeepseekV3ForCausalLM", deepseek_v3_config),
    ParityCase(
        "deepseek-v3-no-qlora-neox-rope",
        "DeepseekV3ForCausalLM",
        lambda: deepseek_v3_config(q_lora_rank=None, rope_interleave=False),
    ),
    ParityCase("gpt-neox-parallel-rotary25", "GPTNeoXForCausalLM", gpt_neox_config),
    ParityCase(
        "gpt-neox-serial-rotary50",
        "GPTNeoXForCausalLM",
        lambda: gpt_neox_config(use_parallel_residual=False, rotary_pct=0.5),
    ),
]

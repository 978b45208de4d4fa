"""vLLM's names for what an offline engine holds, for scripts written against vLLM:
``llm.llm_engine.model_config.max_model_len``, ``llm.llm_engine.vllm_config`` and
``llm.llm_engine.get_tokenizer()``. Both offline engines (``LLMEngine``,
``DataParallelEngine``) have a ``cfg`` and a ``tokenizer``; this mixin names them."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import ModelConfigView, VllmConfig


class VllmEngineNames:
    cfg: VllmConfig
    tokenizer: PreTrainedTokenizerBase

    @property
    def vllm_config(self) -> VllmConfig:
        return self.cfg

    @property
    def model_config(self) -> ModelConfigView:
        return ModelConfigView.of(self.cfg)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.tokenizer

"""Decoder-only base models without an LM head, for ``model.runner=pooling``.

Embedding checkpoints saved from transformers' ``AutoModel`` name their
architecture ``LlamaModel``, ``Qwen2Model``, ``Qwen3Model`` or ``MistralModel``
and hold the decoder's tensors without the ``model.`` prefix and no
``lm_head``. Each class here is the matching ``*ForCausalLM`` whose weights load
into its decoder; its LM head shares the embedding (so the runner's logits path
stays well-formed), but a pooling runner never samples from it.

A module of its own because it is the model registry's target for these four
architectures (``config/model.py``), one adapter applied to four model families,
as vLLM's ``as_embedding_model``: folded into the model files it would be spread
over four, and ``pooler.py`` is the runner's side of pooling, not a model.
"""

from __future__ import annotations

from typing import Any, Iterable

from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.models.llama import LlamaForCausalLM
from minivllm.models.mistral import MistralForCausalLM
from minivllm.models.qwen2 import Qwen2ForCausalLM
from minivllm.models.qwen3 import Qwen3ForCausalLM
from minivllm.models.utils import load_weights


def _base_model(causal_cls: type[LlamaForCausalLM], name: str) -> type[LlamaForCausalLM]:
    class BaseModel(causal_cls):
        def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **layer_opts: Any) -> None:
            super().__init__(config, backend, **layer_opts)
            self.lm_head.tie_to(self.model.embed_tokens)

        def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
            renamed = ((n.removeprefix("model."), t) for n, t in weights)
            load_weights(self.model, renamed, self.packed_modules_mapping, ("rotary_emb.inv_freq",))

    BaseModel.__name__ = BaseModel.__qualname__ = name
    return BaseModel


LlamaBaseModel = _base_model(LlamaForCausalLM, "LlamaBaseModel")
Qwen2BaseModel = _base_model(Qwen2ForCausalLM, "Qwen2BaseModel")
Qwen3BaseModel = _base_model(Qwen3ForCausalLM, "Qwen3BaseModel")
MistralBaseModel = _base_model(MistralForCausalLM, "MistralBaseModel")

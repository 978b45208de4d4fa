"""LLaVA-1.5: a CLIP vision tower, an MLP projector, and a Llama language model.

An image's embeddings are the projector applied to one hidden layer of the tower
(``vision_feature_layer``; a list concatenates several), without the CLS row when
``vision_feature_select_strategy`` is "default". The runner writes them over the
image's placeholder tokens (``image_token_index``) and runs the language model on
the merged ``inputs_embeds`` (``models/interfaces.py``: ``SupportsMultiModal``).
The tower and the projector are replicated on every tensor-parallel rank.

Checkpoint names: transformers writes ``language_model.model.*`` /
``language_model.lm_head.*`` / ``vision_tower.*`` / ``multi_modal_projector.*``
(older checkpoints also ``vision_tower.vision_model.*``); its in-memory layout
(``model.language_model.*``, ``model.vision_tower.*``, ``lm_head.*``) is accepted
too. ``checkpoint_name`` maps every spelling onto this module's names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.layers.weight_utils import default_weight_loader
from minivllm.models.clip import CLIPVisionTransformer, Linear
from minivllm.models.llama import LlamaForCausalLM

_RENAMES = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
    ("vision_tower.vision_model.", "vision_tower."),
)


def checkpoint_name(name: str) -> str:
    """Any transformers spelling of a LLaVA tensor name -> this module's name."""
    for old, new in _RENAMES:
        if name.startswith(old):
            name = new + name[len(old) :]
    return name


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, config: PretrainedConfig, num_feature_layers: int) -> None:
        super().__init__()
        bias = getattr(config, "multimodal_projector_bias", True)
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        self.linear_1 = Linear(vision * num_feature_layers, text, bias=bias)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = Linear(text, text, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    supports_multimodal: ClassVar[bool] = True
    batches_multimodal: ClassVar[bool] = True
    supports_pp: ClassVar[bool] = False

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **layer_opts: Any) -> None:
        super().__init__()
        self.config = config
        layer = config.vision_feature_layer
        self.feature_layers = [layer] if isinstance(layer, int) else list(layer)
        self.select_strategy = config.vision_feature_select_strategy
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy={self.select_strategy!r}: expected default or full")
        self.vision_tower = CLIPVisionTransformer(config.vision_config)
        self.multi_modal_projector = LlavaMultiModalProjector(config, len(self.feature_layers))
        self.language_model = LlamaForCausalLM(config.text_config, backend, **layer_opts)

    @classmethod
    def image_token_id(cls, hf_config: PretrainedConfig) -> int:
        return int(hf_config.image_token_index if hasattr(hf_config, "image_token_index") else hf_config.image_token_id)

    @classmethod
    def profile_image_size(
        cls, hf_config: PretrainedConfig, image_processor: Any, max_tokens: int
    ) -> tuple[int, int] | None:
        """The processor resizes and crops every image to the tower's square, so every image
        takes the same tokens: a patch each, plus the CLS row under the "full" strategy."""
        vision = hf_config.vision_config
        tokens = (vision.image_size // vision.patch_size) ** 2 + (hf_config.vision_feature_select_strategy == "full")
        return (vision.image_size, vision.image_size) if tokens <= max_tokens else None

    def embed_multimodal(self, pixel_values: torch.Tensor, **_: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) pixels of B images -> (B * patches, text hidden): each image's rows in turn."""
        states = self.vision_tower.hidden_states(pixel_values, self.feature_layers)  # each (B, 1 + P, vision)
        if self.select_strategy == "default":
            states = [s[:, 1:] for s in states]  # drop the CLS row
        features = torch.cat(states, dim=-1).flatten(0, 1)  # (B * P, vision * layers)
        return self.multi_modal_projector(features)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:  # (N,) -> (N, hidden)
        return self.language_model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.language_model(input_ids, positions, meta, intermediate, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The language model's tensors go to ``LlamaForCausalLM.load_weights`` (fused q/k/v,
        tied heads); the tower's and the projector's are copied by name."""
        others: list[tuple[str, Any]] = []
        prefix = "language_model."

        def language(stream: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
            for name, tensor in stream:
                name = checkpoint_name(name)
                if name.startswith(prefix):
                    yield name[len(prefix) :], tensor
                else:
                    others.append((name, tensor))

        self.language_model.load_weights(language(weights))
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in others:
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(self).__name__}")
            default_weight_loader(params[name], tensor)
            loaded.add(name)
        missing = {n for n in params if not n.startswith(prefix)} - loaded
        if missing:
            raise ValueError(f"checkpoint has no tensors for: {', '.join(sorted(missing)[:8])}")

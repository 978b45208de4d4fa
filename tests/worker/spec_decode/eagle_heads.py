"""A transformers reference of an EAGLE head's greedy drafts (heads: tools/make_eagle_head.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


class EagleReference:
    """Greedy EAGLE drafts recomputed from scratch with transformers' modules (no KV cache)."""

    @torch.no_grad()
    def __init__(self, target: Path, head: Path) -> None:
        self.target = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        config = LlamaConfig.from_pretrained(head)
        config._attn_implementation = "eager"
        self.layer = LlamaDecoderLayer(config, layer_idx=0).eval()
        weights = load_file(head / "model.safetensors")
        self.layer.load_state_dict(
            {k.removeprefix("layers.0."): v for k, v in weights.items() if k.startswith("layers.0.")}, strict=False
        )
        self.layer.input_layernorm = torch.nn.Identity()
        self.fc = weights["fc.weight"]
        self.rope = LlamaRotaryEmbedding(config)

    @torch.no_grad()
    def drafts(self, tokens: list[int], k: int) -> list[int]:
        """The head's k greedy drafts after ``tokens`` (the last one is the newest)."""
        ids = torch.tensor([tokens])
        hidden = self.target.model(ids).last_hidden_state[0]  # (P + 1, H) after the final norm
        embed = self.target.model.embed_tokens
        inputs = [torch.cat((embed(ids[0, 1:]), hidden[:-1]), dim=-1) @ self.fc.T]  # positions 0 .. P - 1
        out = []
        for _ in range(k):
            x = torch.cat(inputs)  # (L, H)
            y = self._layer(x)
            token = int(self.target.lm_head(y[-1]).argmax())
            out.append(token)
            inputs.append((torch.cat((embed(torch.tensor([token])), y[-1:]), dim=-1) @ self.fc.T))
        return out

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        positions = torch.arange(n).unsqueeze(0)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        result = self.layer(
            x.unsqueeze(0),
            attention_mask=mask,
            position_ids=positions,
            position_embeddings=self.rope(x.unsqueeze(0), positions),
        )
        return (result[0] if isinstance(result, tuple) else result)[0]

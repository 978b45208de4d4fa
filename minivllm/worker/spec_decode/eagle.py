"""EAGLE: a one-layer head that drafts from the target's own last hidden states.

The head reads, at position ``p``, the embedding of token ``p + 1`` beside the
target's hidden state at ``p`` (after its final norm), mixes them with ``fc``
and runs its decoder layer(s) with their own paged KV cache; the target's LM
head turns the result into the distribution of token ``p + 2``::

    x_p = fc(concat(embed(token[p + 1]), h_p))          (2H -> H, no bias)
    y_p = layers(x_p)  (the first layer has no input norm; output = hidden + residual)
    logits of token p + 2 = target.lm_head(y_p)

To draft further it feeds its own output ``y`` in place of the target's hidden
state. Embeddings and LM head are the target's, shared, not loaded.

Checkpoint layout (as vLLM's EAGLE-1 loader reads it): ``config.json`` a Llama
config (``num_hidden_layers`` usually 1, the target's ``hidden_size`` and
vocabulary), tensors ``fc.weight`` (H, 2H) and ``layers.N.*`` in Llama's names,
optionally under ``model.``; ``embed_tokens.*`` / ``lm_head.*`` and the first
layer's ``input_layernorm.weight`` are ignored when present.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.config.vllm_config import VllmConfig
from minivllm.layers.attention import attention_layers
from minivllm.layers.rotary import share_cos_sin_caches
from minivllm.model_loader.weight_files import find_weight_files, iterate_weights
from minivllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from minivllm.models.utils import load_weights
from minivllm.sample.sampler import Sampler
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.spec_decode.draft_model import DraftModelProposer
from minivllm.worker.step_inputs import StepInputs

_IGNORED = ("embed_tokens.", "lm_head.", "rotary_emb.inv_freq", "layers.0.input_layernorm.")


class EagleLlamaHead(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        opts = LlamaForCausalLM.attention_options(config)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend, i, **opts) for i in range(config.num_hidden_layers)
        )
        self.layers[0].input_layernorm = nn.Identity()  # the fc output goes in unnormalized
        self.embed: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.lm_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    def bind_target(self, target: nn.Module) -> None:
        """Share the target's token embeddings and LM head."""
        self.embed = target.model.embed
        self.lm_logits = target.compute_logits

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, hidden_in: torch.Tensor
    ) -> torch.Tensor:
        """(T,) tokens ``p + 1`` and (T, H) hidden states at ``p`` -> (T, H) the head's outputs."""
        x = self.fc(torch.cat((self.embed(input_ids), hidden_in.to(self.fc.weight.dtype)), dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, meta)
        return x + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, H) -> (N, vocab) fp32
        return self.lm_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        renamed = ((name.removeprefix("model."), tensor) for name, tensor in weights)
        load_weights(self, renamed, LlamaForCausalLM.packed_modules_mapping, _IGNORED)


class EagleProposer(DraftModelProposer):
    """The draft-model proposer with an EAGLE head: inputs shifted by one token, the
    target's hidden states into the catch-up pass, the head's own into later passes."""

    shift = 1

    def load_model(self, backend: AttentionBackend, target: nn.Module) -> None:
        self.backend = backend
        cfg = self.cfg
        with torch.device("meta"):
            head = EagleLlamaHead(cfg.hf_config, backend).to(dtype=cfg.dtype)
        head = head.to_empty(device=self.device)
        kind, files = find_weight_files(cfg.checkpoint_dir, "auto")
        try:
            head.load_weights(iterate_weights(kind, files))
        except ValueError as e:
            raise ValueError(f"speculative.model={cfg.model.path!r}: not an EAGLE head checkpoint: {e}") from e
        head.bind_target(target)
        share_cos_sin_caches(head, cfg.max_model_len, self.device)
        self.model = head.eval()
        self.layers = attention_layers(head)

    def catch_up(self, step: StepInputs) -> None:
        hidden = torch.zeros(len(step.input_ids), self.cfg.hf_config.hidden_size, device=self.device)
        self.model(step.input_ids, step.positions, step.meta, hidden)

    def _catch_up_pass(self, inputs: StepInputs, step: StepInputs, target_hidden: torch.Tensor) -> torch.Tensor:
        """Every catch-up token sits at a position the target computed this step, at the same
        offset into its row: the target's hidden state there is the head's second input."""
        at = np.searchsorted(step.rows, inputs.rows)  # step rows are in ascending row order
        lens = inputs.query_lens
        offsets = np.arange(len(inputs.token_positions)) - np.repeat(inputs.query_start[:-1], lens)
        flat = np.repeat(step.query_start[at], lens) + offsets  # (T',) rows of the target's step
        hidden_in = target_hidden[torch.from_numpy(flat.astype(np.int64)).to(self.device)]
        return self.model(inputs.input_ids, inputs.positions, inputs.meta, hidden_in)

    def _decode_pass(
        self, batch: InputBatch, rows: np.ndarray, positions: np.ndarray, tokens: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        meta = self._decode_metadata(batch, rows, positions)
        return self.model(tokens, torch.from_numpy(positions).to(self.device), meta, last)


def model_proposer(cfg: VllmConfig, sampler: Sampler, device: torch.device) -> DraftModelProposer:
    """The worker-side proposer of ``speculative.method`` (draft_model or eagle)."""
    cls = EagleProposer if cfg.speculative.method == "eagle" else DraftModelProposer
    return cls(cfg, sampler, device)

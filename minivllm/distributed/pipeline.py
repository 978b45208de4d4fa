"""Pipeline parallelism: which decoder layers a stage holds, and moving activations between stages.

Stage ``s`` builds only its range of decoder layers; the others are
``MissingLayer`` placeholders (no weights, no KV cache), and the loader skips
their checkpoint tensors. Likewise only the first stage builds the embeddings
and only the last the final norm and the LM head (which, with tied embeddings
and the embedding on another stage, loads the embedding's tensor itself).
A non-first stage receives the previous stage's intermediate tensors (the
hidden states, and the residual stream for Llama) instead of embedding tokens;
a non-last stage sends them on instead of normalising. Every tp rank of stage s sends to the same tp rank of stage s+1
(they all hold the same activations after their all-reduce)::

    stage 0 (ranks 0..tp-1)   embed, layers [0, a)  ──send──> rank + tp
    stage 1 (ranks tp..2tp-1) layers [a, b), norm, lm_head, sampling

The receiver knows the shapes: (tokens in the step, hidden size) each, in
the model's dtype; tokens in the step are the same on every stage. Nothing
flows back: the earlier stages learn the last stage's sampled tokens from the
scheduler, with the request's next step (``CachedRequestData.new_token_ids``),
so a stage never waits for a later one and can start the next micro-batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from minivllm.config.parallel import check_partition
from minivllm.distributed.parallel_state import PipelineLayout, pipeline_layout

IntermediateTensors = dict[str, torch.Tensor]
"""Named (tokens, hidden) tensors handed from one stage to the next."""


def layer_range(num_layers: int, layout: PipelineLayout | None = None) -> tuple[int, int]:
    """``[start, end)`` of the decoder layers this process's stage holds."""
    layout = layout or pipeline_layout()
    parts = check_partition(num_layers, layout.num_stages, list(layout.layer_partition or []) or None)
    start = sum(parts[: layout.stage])
    return start, start + parts[layout.stage]


class MissingLayer(nn.Module):
    """Stands in for a module (a decoder layer, the embeddings, the LM head) another pipeline stage holds."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this module lives on another pipeline stage")


def on_first_stage(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` on the first pipeline stage (the embeddings); a ``MissingLayer`` on the others."""
    return make() if pipeline_layout().stage == 0 else MissingLayer()


def on_last_stage(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` on the last pipeline stage (final norm, LM head); a ``MissingLayer`` on the others."""
    layout = pipeline_layout()
    return make() if layout.stage == layout.num_stages - 1 else MissingLayer()


def holds(module: nn.Module | None) -> bool:
    return module is not None and not isinstance(module, MissingLayer)


def tie_where_held(head: nn.Module, embedding: nn.Module) -> None:
    """Share the embedding's weight with the LM head when this stage holds both."""
    if holds(head) and holds(embedding):
        head.tie_to(embedding)


def tied_head_weights(
    weights: Iterable[tuple[str, Any]],
    embedding_name: str,
    head: nn.Module,
    embedding: nn.Module,
    head_name: str = "lm_head.weight",
) -> Iterator[tuple[str, Any]]:
    """Checkpoint tensors of a model with tied embeddings: a stored head weight is
    dropped, and a last stage without the embedding loads its tensor into the LM head."""
    head_loads_it = holds(head) and not holds(embedding)
    for name, tensor in weights:
        if name == head_name:
            continue
        yield (head_name if head_loads_it and name == embedding_name else name), tensor


def build_stage_layers(num_layers: int, make_layer) -> tuple[nn.ModuleList, int, int]:
    """``make_layer(i)`` for this stage's layers, ``MissingLayer`` for the rest; with the range."""
    start, end = layer_range(num_layers)
    layers = nn.ModuleList(make_layer(i) if start <= i < end else MissingLayer() for i in range(num_layers))
    return layers, start, end


def missing_module_names(model: nn.Module) -> tuple[str, ...]:
    """``"name."`` of each module this stage does not hold: prefixes of checkpoint tensors to skip."""
    return tuple(f"{name}." for name, module in model.named_modules() if isinstance(module, MissingLayer))


class PipelineStage:
    """A runner's link to its neighbouring stages (only built when pp > 1)."""

    def __init__(self, keys: tuple[str, ...], hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        layout = pipeline_layout()
        self.keys, self.hidden_size, self.dtype, self.device = keys, hidden_size, dtype, device
        self.is_first = layout.stage == 0
        self.is_last = layout.stage == layout.num_stages - 1
        rank = dist.get_rank()
        self.prev_rank, self.next_rank = rank - layout.tp, rank + layout.tp

    def empty(self, num_tokens: int) -> IntermediateTensors:
        return {k: torch.zeros(num_tokens, self.hidden_size, dtype=self.dtype, device=self.device) for k in self.keys}

    def recv(self, num_tokens: int) -> IntermediateTensors | None:
        """The previous stage's tensors for this step (None on the first stage)."""
        if self.is_first:
            return None
        tensors = {
            k: torch.empty(num_tokens, self.hidden_size, dtype=self.dtype, device=self.device) for k in self.keys
        }
        for key in self.keys:
            dist.recv(tensors[key], src=self.prev_rank)
        return tensors

    def send(self, tensors: IntermediateTensors) -> None:
        for key in self.keys:
            dist.send(tensors[key].contiguous(), dst=self.next_rank)


def pipeline_stage(cfg, model: nn.Module, device: torch.device) -> PipelineStage | None:
    """The runner's ``PipelineStage`` for ``cfg`` (a VllmConfig); None when pp=1 (nothing to do)."""
    if cfg.parallel.pp == 1:
        return None
    text_config = getattr(cfg.hf_config, "text_config", None) or cfg.hf_config
    return PipelineStage(model.pp_intermediate_keys, text_config.hidden_size, cfg.dtype, device)

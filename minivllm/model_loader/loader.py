"""The default model loader: registry lookup, meta-device build, weight fill-in."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn
from tqdm.auto import tqdm

from minivllm.attention.backend import AttentionBackend
from minivllm.config.vllm_config import VllmConfig
from minivllm.model_loader.weight_files import find_weight_files, iterate_weights
from minivllm.models.registry import ModelRegistry
from minivllm.quantization import build_quant_config, process_weights_after_loading, quantize_model


class DefaultModelLoader:
    """Builds the model class named by config.json on the meta device (no memory,
    no random init), materialises it on the target device, then loads weights
    (or draws random ones for ``load.format=dummy``)."""

    def load_model(self, cfg: VllmConfig, backend: AttentionBackend, device: torch.device) -> nn.Module:
        model = build_empty_model(cfg, backend, device)
        if cfg.load.format == "dummy":
            init_dummy_weights(model, seed=cfg.model.seed)
        else:
            model.load_weights(self._weights(cfg))
        process_weights_after_loading(model)
        return model.eval()

    def _weights(self, cfg: VllmConfig) -> Iterator[tuple[str, Any]]:
        kind, files = find_weight_files(cfg.checkpoint_dir, cfg.load.format)
        show = cfg.load.use_tqdm and len(files) > 1
        for path in tqdm(files, desc="Loading weights", unit="file", disable=not show or None):
            yield from iterate_weights(kind, [path])


def _model_options(cfg: VllmConfig) -> dict[str, Any]:
    """Keyword options for the model class beyond (hf_config, backend); only MoE models take any."""
    return {"expert_parallel": True} if cfg.parallel.enable_expert_parallel else {}


def build_empty_model(cfg: VllmConfig, backend: AttentionBackend, device: torch.device) -> nn.Module:
    """The model class for ``cfg``, built on the meta device and materialised (uninitialised) on ``device``."""
    model_cls = ModelRegistry.resolve(cfg.architecture)
    with torch.device("meta"):
        model = model_cls(cfg.hf_config, backend, **_model_options(cfg))
        model = model.to(dtype=cfg.dtype)
        if cfg.quant_spec is not None:  # after .to(dtype): quantized weights keep their dtypes
            quantize_model(model, build_quant_config(cfg.quant_spec), cfg.dtype)
    model = model.to_empty(device=device)
    for module in model.modules():  # materialising drops shared parameters; restore them
        if hasattr(module, "retie"):
            module.retie()
    return model


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, low: float = -1e-3, high: float = 1e-3) -> None:
    """Uniform random weights (vLLM's dummy format); norm scales around 1 so activations stay sane.
    Drawn on each parameter's device, by one generator per device seeded with ``seed``: a
    7B model's values take half a minute to draw on one CPU core, well under a second on a GPU
    (CPU and GPU runs of one seed get different values)."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if param.device not in gens:
            gens[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        values.uniform_(low, high, generator=gens[param.device])
        if "norm" in name and name.endswith("weight"):
            values += 1.0
        param.data.copy_(values)

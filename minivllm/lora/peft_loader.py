"""Reading a PEFT LoRA adapter folder into per-module ``(A, B)`` pairs.

PEFT stores ``lora_A.weight`` as (r, in) and ``lora_B.weight`` as (out, r) for
each targeted Linear, under names like
``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight``. Here they
become ``A`` (in, r) and ``B`` (r, out) with the adapter's scaling folded into
``B``, so a layer adds ``x @ A @ B``. Scaling is ``lora_alpha / r``, or
``lora_alpha / sqrt(r)`` with rsLoRA.

Everything is checked against the base model's dimensions before any slot is
touched; a bad adapter raises ``ValueError`` naming it. The front end reads and
checks each adapter once per ``lora_int_id`` (``LoRAChecker``), before anything is
queued, so a bad adapter is a ValueError for its request and the engine keeps
serving; an id stays bound to its first folder.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PretrainedConfig

from minivllm.config.lora import LoRAConfig
from minivllm.lora_request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION_MODULES + MLP_MODULES
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_UNSUPPORTED_OPTIONS = {
    "use_dora": False,
    "bias": "none",
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
}
"""PEFT options the loader does not implement, with the value that means "not used"."""


@dataclass
class LoRAAdapter:
    """One adapter on the host: ``weights[(layer, module)] = (A (in, r), B (r, out) * scaling)``."""

    request: LoRARequest
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def module_dims(hf_config: PretrainedConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA-targetable module of a Llama-like decoder layer."""
    hidden, heads = hf_config.hidden_size, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, getattr(hf_config, "num_key_value_heads", heads) * head_dim
    inter = hf_config.intermediate_size
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def load_peft_adapter(request: LoRARequest, hf_config: PretrainedConfig, max_rank: int) -> LoRAAdapter:
    """Read and check ``request``'s folder; raises ValueError naming the adapter on any problem."""
    folder = Path(request.lora_path)
    name = f"LoRA adapter {request.lora_name!r} ({folder})"
    peft_cfg = _read_config(folder, name)
    rank = int(peft_cfg.get("r", 0))
    if not 1 <= rank <= max_rank:
        raise ValueError(f"{name}: rank r={rank} is above lora.max_lora_rank={max_rank} (or below 1)")
    alpha = float(peft_cfg.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if peft_cfg.get("use_rslora") else alpha / rank
    if not (folder / WEIGHTS_FILE).is_file():
        raise ValueError(f"{name}: missing {WEIGHTS_FILE}")
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{name}: {WEIGHTS_FILE} is not a safetensors file ({err})") from None
    weights = _pair_up(tensors, name, rank, hf_config)
    weights = {key: (a.t().contiguous(), (b.t() * scaling).contiguous()) for key, (a, b) in weights.items()}
    return LoRAAdapter(request, rank, weights)


def _read_config(folder: Path, name: str) -> dict:
    if not (folder / CONFIG_FILE).is_file():
        raise ValueError(f"{name}: missing {CONFIG_FILE} (expected a PEFT adapter folder)")
    try:
        cfg = json.loads((folder / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{name}: {CONFIG_FILE} is not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: {CONFIG_FILE} must hold a JSON object, not a {_json_kind(cfg)}")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{name}: peft_type={cfg.get('peft_type')!r} is not supported (only LORA)")
    for key, default in _UNSUPPORTED_OPTIONS.items():
        if cfg.get(key, default) not in (default, None, {}):
            raise ValueError(f"{name}: {key}={cfg[key]!r} is not supported (only {default!r})")
    return cfg


def _json_kind(value: object) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _pair_up(
    tensors: dict[str, torch.Tensor], name: str, rank: int, hf_config: PretrainedConfig
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """Group ``lora_A`` / ``lora_B`` by (layer, module) and check every name and shape."""
    dims, num_layers = module_dims(hf_config), hf_config.num_hidden_layers
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise ValueError(f"{name}: tensor {key!r} is not a LoRA weight of a decoder layer")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in dims:
            raise ValueError(f"{name}: target module {module!r} is not supported; supported: {', '.join(dims)}")
        if layer >= num_layers:
            raise ValueError(f"{name}: layer {layer} does not exist (the model has {num_layers})")
        halves.setdefault((layer, module), {})[half] = tensor.float()
    pairs = {}
    for (layer, module), ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{name}: layers.{layer}.{module} lacks lora_A or lora_B")
        fan_in, fan_out = dims[module]
        for half, want in (("A", (rank, fan_in)), ("B", (fan_out, rank))):
            if tuple(ab[half].shape) != want:
                raise ValueError(
                    f"{name}: layers.{layer}.{module}.lora_{half} has shape {tuple(ab[half].shape)}, expected {want}"
                )
        pairs[(layer, module)] = (ab["A"], ab["B"])
    if not pairs:
        raise ValueError(f"{name}: {WEIGHTS_FILE} holds no LoRA weights")
    return pairs


class LoRAChecker:
    """The front end's check of a request's ``LoRARequest`` (module docstring)."""

    def __init__(self, cfg: LoRAConfig, hf_config: PretrainedConfig) -> None:
        self.cfg, self.hf_config = cfg, hf_config
        self.checked: dict[int, LoRARequest] = {}

    def check(self, lora: Any) -> None:
        if lora is None:
            return
        if not self.cfg.enable_lora:
            raise ValueError("lora_request: needs lora.enable_lora=true (LLM(enable_lora=True))")
        if not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request={lora!r}: must be a LoRARequest or None")
        known = self.checked.get(lora.lora_int_id)
        if known is not None:
            if known.lora_path != lora.lora_path:
                raise ValueError(
                    f"lora_request: lora_int_id={lora.lora_int_id} already names {known.lora_path!r}, "
                    f"not {lora.lora_path!r}"
                )
            return
        load_peft_adapter(lora, self.hf_config, self.cfg.max_lora_rank)
        self.checked[lora.lora_int_id] = lora

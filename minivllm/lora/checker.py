"""Front-end checks of a request's ``LoRARequest``, before anything is queued.

The adapter folder is read and checked once per adapter id (rank, target
modules, shapes), so a bad adapter is a ValueError for its request and the
engine keeps serving. An id stays bound to its first folder.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.config.lora import LoRAConfig
from minivllm.lora.peft_loader import load_peft_adapter
from minivllm.lora_request import LoRARequest


class LoRAChecker:
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

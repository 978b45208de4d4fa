"""``LoRARequest``: which adapter a request runs under (vLLM's fields).

A user-facing type that the request, the scheduler's output, the front end and
the workers all carry, so it sits at the bottom of the package graph and
imports nothing of the engine (vLLM's ``vllm.lora.request.LoRARequest``). A module
of its own, like ``sampling_params.py``: ``request.py`` and ``core/`` need it below
``lora/``, and users import it as ``from minivllm.lora import LoRARequest``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).

    ``lora_int_id`` identifies the adapter everywhere (slots, the prefix-cache
    hash); it must be >= 1 and name one folder for the engine's lifetime.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id={self.lora_int_id!r}: must be an int >= 1")
        if not self.lora_name:
            raise ValueError("LoRARequest.lora_name: must be a non-empty string")
        if not self.lora_path:
            raise ValueError(f"LoRARequest.lora_path for {self.lora_name!r}: must be an adapter folder")

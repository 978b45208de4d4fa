"""Multi-LoRA serving: many PEFT adapters on one base model, batched in one step.

The seam (see DESIGN.md): each token of a step carries the slot of its
request's adapter (or none); the wrapped linear layers add ``x @ A @ B`` of that
slot to the base layer's output. Adapters live on the host until a request
needs one, then in one of ``lora.max_loras`` device slots (LRU).
"""

from minivllm.config.lora import LoRAConfig
from minivllm.lora_request import LoRARequest

__all__ = ["LoRAConfig", "LoRARequest"]
